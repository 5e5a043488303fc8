package vethlink

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultMTU is used when Spec.MTU is 0.
const DefaultMTU = 1500

// Spec names the link's two ends and their addresses.
type Spec struct {
	AgentName   string       // the agent's end, in the agent's namespace
	SidecarName string       // the sidecar's end, in the sidecar's namespace
	AgentAddr   netip.Prefix // e.g. 169.254.77.1/30
	SidecarAddr netip.Prefix // e.g. 169.254.77.2/30: the agent's gateway
	// Routes are more IPv4 destinations the agent reaches via the sidecar's end
	// (e.g. the sidecar's own address on another network, so that every packet
	// from the agent to its sidecar comes over the link).
	Routes []netip.Prefix
	MTU    int // both ends; DefaultMTU if 0
}

func (s Spec) mtu() int {
	if s.MTU == 0 {
		return DefaultMTU
	}
	return s.MTU
}

// Validate names the first field that is wrong and why.
func (s Spec) Validate() error {
	for _, f := range []struct{ field, name string }{{"AgentName", s.AgentName}, {"SidecarName", s.SidecarName}} {
		if f.name == "" || len(f.name) > 15 || strings.ContainsAny(f.name, "/: \t\n\x00") {
			return fmt.Errorf("vethlink: %s %q: want a link name of 1-15 characters without /, : or spaces", f.field, f.name)
		}
	}
	for _, f := range []struct {
		field string
		p     netip.Prefix
	}{{"AgentAddr", s.AgentAddr}, {"SidecarAddr", s.SidecarAddr}} {
		if !f.p.IsValid() || !f.p.Addr().Is4() || f.p.Bits() > 30 {
			return fmt.Errorf("vethlink: %s %v: want an IPv4 address with a prefix of /30 or shorter", f.field, f.p)
		}
		if host := f.p.Addr(); host == f.p.Masked().Addr() || host == lastAddr(f.p) {
			return fmt.Errorf("vethlink: %s %v: is the network or broadcast address of its prefix", f.field, f.p)
		}
	}
	if s.AgentAddr.Masked() != s.SidecarAddr.Masked() {
		return fmt.Errorf("vethlink: AgentAddr %v and SidecarAddr %v: want the same subnet", s.AgentAddr, s.SidecarAddr)
	}
	if s.AgentAddr.Addr() == s.SidecarAddr.Addr() {
		return fmt.Errorf("vethlink: AgentAddr and SidecarAddr are both %v: want two addresses", s.AgentAddr.Addr())
	}
	for _, r := range s.Routes {
		if !r.IsValid() || !r.Addr().Is4() || r.Masked() != r || r.Bits() == 0 {
			return fmt.Errorf("vethlink: Routes %v: want canonical IPv4 prefixes, none of them a default route", s.Routes)
		}
	}
	if s.MTU != 0 && (s.MTU < 1280 || s.MTU > 65535) {
		return fmt.Errorf("vethlink: MTU %d: want 0 (default %d) or 1280-65535", s.MTU, DefaultMTU)
	}
	return nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(b)
}
