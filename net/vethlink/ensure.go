package vethlink

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// in6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE from linux/if_link.h: the
// kernel generates no IPv6 link-local address for the link.
const in6AddrGenModeNone = 1

// Ensure creates the pair if it is missing and brings both ends, their
// addresses and the agent's default routes to what s says. It can run again at
// any time (after Docker re-adds a route, say) with the same result. If a step
// fails and this call created the pair, the pair is deleted again; a pair that
// was already there is left as the failed step left it.
func Ensure(agentNS, sidecarNS netns.NsHandle, s Spec) (err error) {
	if err := s.Validate(); err != nil {
		return err
	}
	p, err := openPair(agentNS, sidecarNS)
	if err != nil {
		return err
	}
	defer p.close()
	a, sc, created, err := p.ensurePair(s)
	if err != nil {
		return err
	}
	if created {
		defer func() {
			if err == nil {
				return
			}
			if derr := p.agent.h.LinkDel(a); derr != nil {
				err = errors.Join(err, fmt.Errorf("vethlink: roll back: delete link %s in %s: %w", s.AgentName, p.agent.label, derr))
			}
		}()
	}
	if err := ensureEnd(p.agent, a, s.AgentAddr, s.mtu()); err != nil {
		return err
	}
	if err := ensureEnd(p.sidecar, sc, s.SidecarAddr, s.mtu()); err != nil {
		return err
	}
	if err := ensureRoutes(p.agent, a, s.SidecarAddr.Addr(), s.Routes); err != nil {
		return err
	}
	for _, end := range []struct {
		sd   side
		name string
	}{{p.agent, s.AgentName}, {p.sidecar, s.SidecarName}} {
		if err := waitOperUp(end.sd, end.name); err != nil {
			return err
		}
	}
	return nil
}

// operUpTimeout bounds the wait for the kernel's deferred link-state work
// (linkwatch, which runs at most once a second) to mark a new end up; until
// then the end has no queue and drops what it is given.
const operUpTimeout = 3 * time.Second

// waitOperUp returns once the link's operational state is up, so that a nil
// Ensure means the link carries packets and Check right after it is clean.
func waitOperUp(sd side, name string) error {
	deadline := time.Now().Add(operUpTimeout)
	for {
		l, err := sd.link(name)
		if err != nil {
			return err
		}
		if l == nil {
			return fmt.Errorf("vethlink: link %s in %s vanished while coming up", name, sd.label)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vethlink: link %s in %s is not up after %v (operational state %s)",
				name, sd.label, operUpTimeout, l.Attrs().OperState)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ensurePair finds both ends or creates them, in one request that puts each
// end straight into its namespace.
func (p *pair) ensurePair(s Spec) (a, sc netlink.Link, created bool, err error) {
	if a, err = p.agent.link(s.AgentName); err != nil {
		return nil, nil, false, err
	}
	if sc, err = p.sidecar.link(s.SidecarName); err != nil {
		return nil, nil, false, err
	}
	switch {
	case a != nil && sc != nil:
		if why := p.peered(a, sc); why != "" {
			return nil, nil, false, fmt.Errorf("vethlink: %s; not touching it", why)
		}
		return a, sc, false, nil
	case a != nil:
		return nil, nil, false, fmt.Errorf("vethlink: %s already has a link %s but %s has no %s; not touching it",
			p.agent.label, s.AgentName, p.sidecar.label, s.SidecarName)
	case sc != nil:
		return nil, nil, false, fmt.Errorf("vethlink: %s already has a link %s but %s has no %s; not touching it",
			p.sidecar.label, s.SidecarName, p.agent.label, s.AgentName)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.AgentName, MTU: s.mtu()},
		PeerName:      s.SidecarName,
		PeerMTU:       uint32(s.mtu()),
		PeerNamespace: netlink.NsFd(p.sidecar.ns),
	}
	if err := p.agent.h.LinkAdd(veth); err != nil {
		return nil, nil, false, fmt.Errorf("vethlink: create veth %s (%s) / %s (%s): %w",
			s.AgentName, p.agent.label, s.SidecarName, p.sidecar.label, err)
	}
	a, errA := p.agent.link(s.AgentName)
	sc, errS := p.sidecar.link(s.SidecarName)
	if err := errors.Join(errA, errS); err != nil || a == nil || sc == nil {
		if a != nil {
			_ = p.agent.h.LinkDel(a) // best effort: the lookup error is what the caller needs
		}
		return nil, nil, false, fmt.Errorf("vethlink: veth %s / %s created but not found again: %w", s.AgentName, s.SidecarName, err)
	}
	return a, sc, true, nil
}

// ensureEnd gives one end IPv6 off, the MTU, exactly one address, and up.
func ensureEnd(sd side, l netlink.Link, addr netip.Prefix, mtu int) error {
	name := l.Attrs().Name
	fail := func(step string, err error) error {
		return fmt.Errorf("vethlink: link %s in %s: %s: %w", name, sd.label, step, err)
	}
	if err := sd.h.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone); err != nil {
		return fail("turn IPv6 address generation off", err)
	}
	if l.Attrs().MTU != mtu {
		if err := sd.h.LinkSetMTU(l, mtu); err != nil {
			return fail(fmt.Sprintf("set MTU %d", mtu), err)
		}
	}
	if err := sd.h.AddrReplace(l, &netlink.Addr{IPNet: ipNet(addr)}); err != nil {
		return fail(fmt.Sprintf("set address %v", addr), err)
	}
	addrs, err := sd.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fail("list addresses", err)
	}
	for _, a := range addrs {
		if a.IPNet.String() != addr.String() {
			if err := sd.h.AddrDel(l, &a); err != nil {
				return fail(fmt.Sprintf("delete address %v", a.IPNet), err)
			}
		}
	}
	if err := sd.h.LinkSetUp(l); err != nil {
		return fail("set up", err)
	}
	return nil
}

// ensureRoutes makes "default via gw dev <agent end>" the agent's only IPv4
// default route, adds the extra routes via gw, and deletes its IPv6 default
// routes. The extra routes go first: the default route is what lets traffic
// out, and once it is there every route it needs is too.
func ensureRoutes(sd side, l netlink.Link, gw netip.Addr, extra []netip.Prefix) error {
	for _, dst := range extra {
		if err := sd.h.RouteReplace(routeVia(l, gw, dst)); err != nil {
			return fmt.Errorf("vethlink: %s: replace route %v via %v dev %s: %w", sd.label, dst, gw, l.Attrs().Name, err)
		}
	}
	want := ourDefault(l, gw)
	if err := sd.h.RouteReplace(want); err != nil {
		return fmt.Errorf("vethlink: %s: replace default route with via %v dev %s: %w", sd.label, gw, l.Attrs().Name, err)
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		defaults, err := defaultRoutes(sd.h, fam)
		if err != nil {
			return fmt.Errorf("vethlink: %s: %w", sd.label, err)
		}
		for _, r := range defaults {
			if fam == netlink.FAMILY_V4 && isOurs(r, l, gw) {
				continue
			}
			if err := sd.h.RouteDel(&r); err != nil {
				return fmt.Errorf("vethlink: %s: delete default route %s: %w", sd.label, r, err)
			}
		}
	}
	return nil
}

func ourDefault(l netlink.Link, gw netip.Addr) *netlink.Route {
	return routeVia(l, gw, netip.PrefixFrom(netip.IPv4Unspecified(), 0))
}

func routeVia(l netlink.Link, gw netip.Addr, dst netip.Prefix) *netlink.Route {
	return &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.AsSlice()), Dst: ipNet(dst), Table: unix.RT_TABLE_MAIN}
}

func isOurs(r netlink.Route, l netlink.Link, gw netip.Addr) bool {
	got, ok := netip.AddrFromSlice(r.Gw)
	return ok && got.Unmap() == gw && r.LinkIndex == l.Attrs().Index && r.Table == unix.RT_TABLE_MAIN
}

// defaultRoutes lists the default routes of one family in every table.
func defaultRoutes(h *netlink.Handle, family int) ([]netlink.Route, error) {
	all, err := h.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []netlink.Route
	for _, r := range all {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask) {
			out = append(out, r)
		}
	}
	return out, nil
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}
}
