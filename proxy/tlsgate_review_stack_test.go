package proxy

import (
	"io"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
)

// The gate must not grow the relay's goroutine stacks, which stay at Go's 2 KiB start
// for a tunnel's life (see direction) and which only a collection would shrink: the
// goroutines' stack memory after a tunnel's first bytes went both ways is the same
// whether they were a ClientHello (read and decided by the gate, a decision line
// written for another name) or not.
func TestTLSGateReviewRelayStackStaysSmall(t *testing.T) {
	const tunnels = 100
	plain := make([]byte, 512)
	for i := range plain {
		plain[i] = 'x'
	}
	for _, tc := range []struct {
		name  string
		first []byte
	}{
		{"not TLS", plain},
		{"the target's own name", hellotest.ClientHello(t, "a.test")},
		{"another allowed name", hellotest.ClientHello(t, "x.svc.test")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","*.svc.test"]}`)
			conns := make([]*tunnelConn, tunnels)
			for i := range conns {
				resp, c := h.connect(h.a.echoHostPort("a.test"), "")
				if c == nil {
					t.Fatalf("CONNECT: %s", resp.Status)
				}
				defer c.Close()
				conns[i] = c
			}
			runtime.GC()
			defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection shrinks stacks meanwhile
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for _, c := range conns {
				if _, err := c.Write(tc.first); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, make([]byte, len(tc.first))); err != nil {
					t.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			// A goroutine that outgrows 2 KiB takes 4 KiB or more: 2 KiB more per tunnel.
			if grew := int64(after.StackInuse) - int64(before.StackInuse); grew > tunnels*1024 {
				t.Fatalf("stacks grew by %d bytes over %d tunnels", grew, tunnels)
			}
		})
	}
}
