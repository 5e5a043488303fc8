package nftredirect

import (
	"net/netip"
	"strings"
	"testing"
)

func TestSpecValidate(t *testing.T) {
	good := Spec{
		Interface: "ce-s0",
		AgentAddr: netip.MustParseAddr("169.254.77.1"),
		TCPPort:   15001,
		DNS:       netip.MustParseAddrPort("169.254.77.2:15053"),
	}
	tests := []struct {
		name   string
		change func(*Spec)
		want   string // part of the error; empty means valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"named table", func(s *Spec) { s.Table = "compass_t1" }, ""},
		{"table with a space", func(s *Spec) { s.Table = "a b" }, `Table "a b"`},
		{"no interface", func(s *Spec) { s.Interface = "" }, `Interface ""`},
		{"interface too long", func(s *Spec) { s.Interface = "abcdefghijklmnop" }, `Interface "abcdefghijklmnop"`},
		{"ipv6 agent", func(s *Spec) { s.AgentAddr = netip.MustParseAddr("2001:db8::1") }, "AgentAddr 2001:db8::1"},
		{"no dns address", func(s *Spec) { s.DNS = netip.AddrPort{} }, "DNS invalid AddrPort"},
		{"dns port 0", func(s *Spec) { s.DNS = netip.AddrPortFrom(s.DNS.Addr(), 0) }, "DNS 169.254.77.2:0"},
		{"dns at the agent", func(s *Spec) { s.DNS = netip.AddrPortFrom(s.AgentAddr, 53) }, "the agent's address"},
		{"no tcp port", func(s *Spec) { s.TCPPort = 0 }, "TCPPort 0"},
		{"same ports", func(s *Spec) { s.DNS = netip.AddrPortFrom(s.DNS.Addr(), s.TCPPort) }, "both 15001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			tt.change(&s)
			err := s.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
