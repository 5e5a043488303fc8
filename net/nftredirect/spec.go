package nftredirect

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultTable is the table name used when Spec.Table is empty.
const DefaultTable = "compass_transparent"

// Spec says what the table must do. The addresses are the two ends of the
// point-to-point link between the agent and the sidecar.
type Spec struct {
	Table       string     // table in family inet; DefaultTable if empty
	Interface   string     // the sidecar's end of the link
	AgentAddr   netip.Addr // the only source accepted on Interface
	SidecarAddr netip.Addr // the sidecar's own end: TCP to it is not redirected
	TCPPort     uint16     // the transparent TCP listener
	DNSPort     uint16     // the DNS server (UDP and TCP)
}

func (s Spec) table() string {
	if s.Table == "" {
		return DefaultTable
	}
	return s.Table
}

// Validate names the first field that is wrong and why.
func (s Spec) Validate() error {
	if s.Table != "" && !validName(s.Table) {
		return fmt.Errorf("nftredirect: Table %q: want 1-64 letters, digits or _", s.Table)
	}
	if s.Interface == "" || len(s.Interface) > 15 || strings.ContainsAny(s.Interface, "/ \t\n\x00") {
		return fmt.Errorf("nftredirect: Interface %q: want a link name of 1-15 characters without / or spaces", s.Interface)
	}
	for _, f := range []struct {
		name string
		addr netip.Addr
	}{{"AgentAddr", s.AgentAddr}, {"SidecarAddr", s.SidecarAddr}} {
		if !f.addr.Is4() {
			return fmt.Errorf("nftredirect: %s %v: want an IPv4 address (the link carries IPv4 only)", f.name, f.addr)
		}
	}
	if s.AgentAddr == s.SidecarAddr {
		return fmt.Errorf("nftredirect: AgentAddr and SidecarAddr are both %v: want the two ends of the link", s.AgentAddr)
	}
	if s.TCPPort == 0 || s.DNSPort == 0 {
		return fmt.Errorf("nftredirect: TCPPort %d, DNSPort %d: want both non-zero", s.TCPPort, s.DNSPort)
	}
	if s.TCPPort == s.DNSPort {
		return fmt.Errorf("nftredirect: TCPPort and DNSPort are both %d: DNS over TCP and other TCP must reach different listeners", s.TCPPort)
	}
	return nil
}

func validName(n string) bool {
	if len(n) == 0 || len(n) > 64 {
		return false
	}
	for _, r := range n {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
