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
	Table     string         // table in family inet; DefaultTable if empty
	Interface string         // the sidecar's end of the link
	AgentAddr netip.Addr     // the only source accepted on Interface
	TCPPort   uint16         // the transparent TCP listener, on every address of the sidecar
	DNS       netip.AddrPort // the DNS server (UDP and TCP): port 53 of any address goes there
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
	if !s.AgentAddr.Is4() {
		return fmt.Errorf("nftredirect: AgentAddr %v: want an IPv4 address (the link carries IPv4 only)", s.AgentAddr)
	}
	if !s.DNS.Addr().Is4() || s.DNS.Port() == 0 {
		return fmt.Errorf("nftredirect: DNS %v: want an IPv4 address of the sidecar's and a non-zero port", s.DNS)
	}
	if s.DNS.Addr() == s.AgentAddr {
		return fmt.Errorf("nftredirect: DNS %v: is the agent's address, want one of the sidecar's", s.DNS)
	}
	if s.TCPPort == 0 {
		return fmt.Errorf("nftredirect: TCPPort 0: want the transparent listener's port")
	}
	if s.TCPPort == s.DNS.Port() {
		return fmt.Errorf("nftredirect: TCPPort and the DNS port are both %d: DNS over TCP and other TCP must reach different listeners", s.TCPPort)
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
