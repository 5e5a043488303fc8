package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTunnelIdleAfterHalfCloseWithStalledReader: a client that half-closes its tunnel
// and then reads nothing while the upstream keeps sending leaves one direction ended
// (EOF) and the other blocked in a write that no read deadline bounds. The tunnel idle
// timeout must still close it: no byte moves for the timeout.
func TestTunnelIdleAfterHalfCloseWithStalledReader(t *testing.T) {
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
	if err := tc.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing from now on.
	select {
	case <-ended:
	case <-time.After(20 * idle):
		t.Fatalf("tunnel still open %v after its last byte (idle timeout %v); active tunnels %v",
			20*idle, idle, testutil.ToFloat64(h.srv.metrics.activeConnect))
	}
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
}
