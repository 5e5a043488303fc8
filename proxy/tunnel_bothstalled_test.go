package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTunnelIdleWithBothPeersStalled: a client and an upstream that both send and
// neither reads leave both directions blocked in writes that no read deadline bounds.
// No byte moves, so the tunnel idle timeout must close the tunnel.
func TestTunnelIdleWithBothPeersStalled(t *testing.T) {
	const idle = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)
	ended := make(chan struct{})
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		defer close(ended)
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return // the proxy closed the tunnel
			}
		}
	})
	_, tc := h.connect(addr.String(), "")
	if tc == nil {
		t.Fatal("CONNECT refused")
	}
	// The client sends until its writes block for good and reads nothing.
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := tc.Write(buf); err != nil {
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(20 * idle):
		t.Fatalf("tunnel still open %v after its last byte (idle timeout %v); active tunnels %v",
			20*idle, idle, testutil.ToFloat64(h.srv.metrics.activeConnect))
	}
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
}
