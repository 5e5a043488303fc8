package vethlink

import (
	"net/netip"
	"strings"
	"testing"
)

func TestSpecValidate(t *testing.T) {
	good := Spec{
		AgentName:   "ce-a0",
		SidecarName: "ce-s0",
		AgentAddr:   netip.MustParsePrefix("169.254.77.1/30"),
		SidecarAddr: netip.MustParsePrefix("169.254.77.2/30"),
	}
	tests := []struct {
		name   string
		change func(*Spec)
		want   string // part of the error; empty means valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"mtu", func(s *Spec) { s.MTU = 1400 }, ""},
		{"wider subnet", func(s *Spec) {
			s.AgentAddr = netip.MustParsePrefix("169.254.77.1/29")
			s.SidecarAddr = netip.MustParsePrefix("169.254.77.6/29")
		}, ""},
		{"no agent name", func(s *Spec) { s.AgentName = "" }, `AgentName ""`},
		{"sidecar name too long", func(s *Spec) { s.SidecarName = "sixteen-chars-xx" }, `SidecarName "sixteen-chars-xx"`},
		{"name with slash", func(s *Spec) { s.AgentName = "a/b" }, `AgentName "a/b"`},
		{"ipv6 address", func(s *Spec) { s.AgentAddr = netip.MustParsePrefix("2001:db8::1/126") }, "AgentAddr 2001:db8::1/126"},
		{"/31", func(s *Spec) { s.SidecarAddr = netip.MustParsePrefix("169.254.77.2/31") }, "SidecarAddr 169.254.77.2/31"},
		{"network address", func(s *Spec) { s.AgentAddr = netip.MustParsePrefix("169.254.77.0/30") }, "network or broadcast"},
		{"broadcast address", func(s *Spec) { s.SidecarAddr = netip.MustParsePrefix("169.254.77.3/30") }, "network or broadcast"},
		{"other subnet", func(s *Spec) { s.SidecarAddr = netip.MustParsePrefix("169.254.78.2/30") }, "same subnet"},
		{"same address", func(s *Spec) { s.SidecarAddr = s.AgentAddr }, "both 169.254.77.1"},
		{"extra route", func(s *Spec) { s.Routes = []netip.Prefix{netip.MustParsePrefix("10.213.0.2/32")} }, ""},
		{"extra default route", func(s *Spec) { s.Routes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")} }, "none of them a default route"},
		{"extra route not canonical", func(s *Spec) { s.Routes = []netip.Prefix{netip.MustParsePrefix("10.213.0.2/24")} }, "canonical IPv4"},
		{"mtu too small", func(s *Spec) { s.MTU = 1000 }, "MTU 1000"},
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
