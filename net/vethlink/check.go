package vethlink

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Check returns one line for each way the pair differs from s: an end
// missing, not paired, down or without carrier, a wrong MTU, a missing or
// unexpected address (any IPv6 address is unexpected), and an agent whose
// IPv4 default routes are not exactly the one via the sidecar's end or that
// has any IPv6 default route. No problems means the link is as Ensure leaves
// it. err is only for failing to read.
func Check(agentNS, sidecarNS netns.NsHandle, s Spec) (problems []string, err error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	p, err := openPair(agentNS, sidecarNS)
	if err != nil {
		return nil, err
	}
	defer p.close()
	a, err := p.agent.link(s.AgentName)
	if err != nil {
		return nil, err
	}
	sc, err := p.sidecar.link(s.SidecarName)
	if err != nil {
		return nil, err
	}
	if a == nil {
		problems = append(problems, fmt.Sprintf("link %s is missing in %s", s.AgentName, p.agent.label))
	}
	if sc == nil {
		problems = append(problems, fmt.Sprintf("link %s is missing in %s", s.SidecarName, p.sidecar.label))
	}
	if a != nil && sc != nil {
		if why := p.peered(a, sc); why != "" {
			problems = append(problems, why)
		}
	}
	for _, end := range []struct {
		sd   side
		l    netlink.Link
		addr netip.Prefix
	}{{p.agent, a, s.AgentAddr}, {p.sidecar, sc, s.SidecarAddr}} {
		if end.l == nil {
			continue
		}
		ps, err := checkEnd(end.sd, end.l, end.addr, s.mtu())
		if err != nil {
			return nil, err
		}
		problems = append(problems, ps...)
	}
	routes, err := checkRoutes(p.agent, a, s)
	if err != nil {
		return nil, err
	}
	return append(problems, routes...), nil
}

func checkEnd(sd side, l netlink.Link, want netip.Prefix, mtu int) ([]string, error) {
	at := l.Attrs()
	where := fmt.Sprintf("link %s in %s", at.Name, sd.label)
	var problems []string
	if at.Flags&net.FlagUp == 0 {
		problems = append(problems, where+" is down")
	} else if at.OperState != netlink.OperUp {
		problems = append(problems, fmt.Sprintf("%s is up but its operational state is %s (is the other end down?)", where, at.OperState))
	}
	if at.MTU != mtu {
		problems = append(problems, fmt.Sprintf("%s has MTU %d, want %d", where, at.MTU, mtu))
	}
	addrs, err := sd.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("vethlink: %s: list addresses: %w", where, err)
	}
	found := false
	for _, a := range addrs {
		if a.IPNet.String() == want.String() {
			found = true
			continue
		}
		problems = append(problems, fmt.Sprintf("%s has unexpected address %v", where, a.IPNet))
	}
	if !found {
		problems = append(problems, fmt.Sprintf("%s lacks address %v", where, want))
	}
	return problems, nil
}

func checkRoutes(sd side, a netlink.Link, s Spec) ([]string, error) {
	var problems []string
	v4, err := defaultRoutes(sd.h, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("vethlink: %s: %w", sd.label, err)
	}
	gw := s.SidecarAddr.Addr()
	ours := 0
	for _, r := range v4 {
		if a != nil && isOurs(r, a, gw) {
			ours++
			continue
		}
		problems = append(problems, fmt.Sprintf("%s has a default route that is not via the sidecar's end: %s", sd.label, r))
	}
	if ours == 0 {
		problems = append(problems, fmt.Sprintf("%s has no default route via %v dev %s", sd.label, gw, s.AgentName))
	}
	for _, dst := range s.Routes {
		ok, err := hasRouteVia(sd, a, gw, dst)
		if err != nil {
			return nil, err
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("%s has no route %v via %v dev %s", sd.label, dst, gw, s.AgentName))
		}
	}
	v6, err := defaultRoutes(sd.h, netlink.FAMILY_V6)
	if err != nil {
		return nil, fmt.Errorf("vethlink: %s: %w", sd.label, err)
	}
	for _, r := range v6 {
		problems = append(problems, fmt.Sprintf("%s has an IPv6 default route: %s", sd.label, r))
	}
	return problems, nil
}

// hasRouteVia reports whether the main table routes dst via gw on a.
func hasRouteVia(sd side, a netlink.Link, gw netip.Addr, dst netip.Prefix) (bool, error) {
	if a == nil {
		return false, nil
	}
	rs, err := sd.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipNet(dst), Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return false, fmt.Errorf("vethlink: %s: list routes to %v: %w", sd.label, dst, err)
	}
	for _, r := range rs {
		if isOurs(r, a, gw) {
			return true, nil
		}
	}
	return false, nil
}
