package docker

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/net/egresslink"
)

// routeTable reads and edits the default routes inside a container's network namespace.
type routeTable interface {
	// DefaultRoutes lists the IPv4 and IPv6 default routes (gateway addresses; an
	// unspecified address for a device route).
	DefaultRoutes(pid int) ([]netip.Addr, error)
	// RemoveDefaultRoutes deletes every default route except those via keep (if valid),
	// and returns what it removed.
	RemoveDefaultRoutes(pid int, keep netip.Addr) ([]netip.Addr, error)
	// AddDefaultRoute adds an IPv4 default route via gw.
	AddDefaultRoute(pid int, gw netip.Addr) error
}

// netlinkRoutes edits routes through a netlink handle bound to the namespace of
// /proc/<pid>/ns/net; the calling thread never changes namespace (see handleIn).
type netlinkRoutes struct{}

func (netlinkRoutes) handle(pid int) (*netlink.Handle, error) {
	// A pid reused by a host process would otherwise get the host's default routes
	// removed; whatever the pid names, the controller's own namespace is never the agent's.
	ns, err := egresslink.OpenPID(pid)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := handleIn(ns)
	if err != nil {
		return nil, fmt.Errorf("netns: netlink handle in /proc/%d/ns/net: %w", pid, err)
	}
	return h, nil
}

// handleIn opens a route netlink handle whose socket lives in ns; every later request
// on it reaches ns from whatever thread sends it. The socket is made by a goroutine of
// its own on a locked thread that enters ns and comes back, following the CNI ns
// package's rules: a thread that cannot come back stays locked, so that the runtime
// ends it with its goroutine rather than hand it, still in the agent's namespace, to
// other work. (netlink.NewHandleAt unlocks its thread even when the way back failed.)
func handleIn(ns netns.NsHandle) (*netlink.Handle, error) {
	type result struct {
		h   *netlink.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("read this thread's namespace: %w", err)}
			return
		}
		defer home.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter: %w", err)}
			return
		}
		h, herr := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err := netns.Set(home); err != nil {
			if herr == nil {
				h.Close()
			}
			done <- result{err: fmt.Errorf("return from the namespace (the thread is dropped): %w", err)}
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		done <- result{h, herr}
	}()
	r := <-done
	return r.h, r.err
}

func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

func defaultRoutes(h *netlink.Handle) ([]netlink.Route, error) {
	var out []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("netns: list routes: %w", err)
		}
		for _, r := range rs {
			if isDefault(r) {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func gwAddr(r netlink.Route) netip.Addr {
	a, ok := netip.AddrFromSlice(r.Gw)
	if !ok {
		if r.Family == netlink.FAMILY_V6 {
			return netip.IPv6Unspecified()
		}
		return netip.IPv4Unspecified()
	}
	return a.Unmap()
}

func (n netlinkRoutes) DefaultRoutes(pid int) ([]netip.Addr, error) {
	h, err := n.handle(pid)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	rs, err := defaultRoutes(h)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, len(rs))
	for i, r := range rs {
		out[i] = gwAddr(r)
	}
	return out, nil
}

func (n netlinkRoutes) RemoveDefaultRoutes(pid int, keep netip.Addr) ([]netip.Addr, error) {
	h, err := n.handle(pid)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	rs, err := defaultRoutes(h)
	if err != nil {
		return nil, err
	}
	var removed []netip.Addr
	for _, r := range rs {
		gw := gwAddr(r)
		if keep.IsValid() && gw == keep {
			continue
		}
		if err := h.RouteDel(&r); err != nil {
			return removed, fmt.Errorf("netns: delete default route via %s: %w", gw, err)
		}
		removed = append(removed, gw)
	}
	return removed, nil
}

func (n netlinkRoutes) AddDefaultRoute(pid int, gw netip.Addr) error {
	h, err := n.handle(pid)
	if err != nil {
		return err
	}
	defer h.Close()
	r := &netlink.Route{Gw: net.IP(gw.AsSlice()), Table: unix.RT_TABLE_MAIN}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("netns: add default route via %s: %w", gw, err)
	}
	return nil
}
