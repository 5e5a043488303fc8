package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"testing"
)

// The server's guard refuses a private address only with Config.DenyPrivate; without
// it the dial is tried (and the harness refuses it, being outside loopback).
func TestServerDenyPrivate(t *testing.T) {
	for _, deny := range []bool{false, true} {
		t.Run(fmt.Sprintf("DenyPrivate=%v", deny), func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.DenyPrivate = deny })
			h.dns.set("lan.test", netip.MustParseAddr("10.1.2.3"))
			h.apply(`{"network_mode":"denylist","denied_hosts":[]}`)
			status, header := h.connectStatus("lan.test:443")
			if deny {
				checkOutcome(t, "CONNECT lan.test:443", status, header, ReasonInternalAddress)
			} else if status != http.StatusBadGateway || header != "error; reason=dial-failed" {
				t.Errorf("CONNECT lan.test:443: %d %q, want the dial tried (502 dial-failed)", status, header)
			}
		})
	}
}
