package proxy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// The gateways of the proxy's routes (the Docker host's end of each bridge) are guarded
// as the proxy's own addresses are: refused in every mode, whatever name leads there,
// unless an allowlist rule names the one address or the operator exempts it.
func TestGuardRefusesRouteGateways(t *testing.T) {
	gw := netip.MustParseAddr("192.0.2.77")
	// A default route through gw, written as the kernel writes /proc/net/route.
	proc := t.TempDir()
	a := gw.As4()
	route := fmt.Sprintf("Iface\tDestination\tGateway\tFlags\neth0\t00000000\t%08X\t0003\n", binary.NativeEndian.Uint32(a[:]))
	// And an IPv6 default route through 2001:db8::77.
	route6 := "00000000000000000000000000000000 00 00000000000000000000000000000000 00 20010db8000000000000000000000077 00000400 00000001 00000000 00000003 eth0\n"
	if err := os.MkdirAll(filepath.Join(proc, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "net", "route"), []byte(route), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "net", "ipv6_route"), []byte(route6), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) {
		c.AllowInternal = []netip.Prefix{netip.MustParsePrefix("127.0.0.4/32")}
		c.ProcRoot = proc
	})
	h.dns.set("host.test", gw)
	for _, tc := range []struct {
		policy, target, reason string
	}{
		{`"public"`, "192.0.2.77:80", ReasonInternalAddress},
		{`"public"`, "host.test:80", ReasonInternalAddress},
		{`"public"`, "[2001:db8::77]:80", ReasonInternalAddress},
		{`{"network_mode":"denylist","denied_hosts":[]}`, "192.0.2.77:22", ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["host.test"]}`, "host.test:80", ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["192.0.2.0/24"]}`, "192.0.2.77:80", ReasonInternalAddress},
		// Lifted by the one address: the dial then goes on (and the harness refuses it,
		// being outside loopback).
		{`{"network_mode":"allowlist","allowed_hosts":["192.0.2.77"]}`, "192.0.2.77:80", "dial-failed"},
		// Another address of the range is not the gateway.
		{`"public"`, "192.0.2.78:80", "dial-failed"},
	} {
		t.Run(fmt.Sprintf("%s %s", tc.policy, tc.target), func(t *testing.T) {
			h.apply(tc.policy)
			status, header := h.connectStatus(tc.target)
			if tc.reason == "dial-failed" {
				if status != 502 || header != "error; reason=dial-failed" {
					t.Errorf("CONNECT %s: %d %q, want the dial to be tried (502 dial-failed)", tc.target, status, header)
				}
				return
			}
			checkOutcome(t, "CONNECT "+tc.target, status, header, tc.reason)
		})
	}
}
