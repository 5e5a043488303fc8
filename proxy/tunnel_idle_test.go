package proxy

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// floodingTunnel opens a tunnel under a tunnel idle timeout of idle to an upstream that
// sends until the proxy closes the tunnel, which closes ended.
func floodingTunnel(t *testing.T, idle time.Duration) (h *harness, tc *tunnelConn, ended <-chan struct{}) {
	t.Helper()
	h = newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)
	done := make(chan struct{})
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return // the proxy closed the tunnel
			}
		}
	})
	_, tc = h.connect(addr.String(), "")
	if tc == nil {
		t.Fatal("CONNECT refused")
	}
	return h, tc, done
}

// TestTunnelIdleWithBlockedWrites: directions blocked in writes that no read deadline
// bounds move no byte, so the tunnel idle timeout must still close the tunnel: a
// client that half-closes and then reads nothing (one direction ended with EOF, the
// other blocked writing to it), and a client and an upstream that both send and
// neither reads (both blocked).
func TestTunnelIdleWithBlockedWrites(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		stall func(t *testing.T, c *tunnelConn)
	}{
		{"half-closed client that reads nothing", func(t *testing.T, c *tunnelConn) {
			if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}},
		{"both peers send and neither reads", func(_ *testing.T, c *tunnelConn) {
			go func() { _, _ = io.Copy(c, zeros{}) }() // until its writes block for good
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, c, ended := floodingTunnel(t, idle)
			tc.stall(t, c)
			select {
			case <-ended:
			case <-time.After(hangGuard):
				t.Fatalf("tunnel still open %v after its last byte (idle timeout %v); active tunnels %v",
					hangGuard, idle, testutil.ToFloat64(h.srv.metrics.activeConnect))
			}
			waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
		})
	}
}

// TestKeepAliveLeavesTheIdleWatchRunning: the watch that cuts a tunnel whose writes
// are blocked also turns on the upstream's keep-alive. One due before the first idle
// check must leave the checks running, so the tunnel is still cut.
func TestKeepAliveLeavesTheIdleWatchRunning(t *testing.T) {
	const idle = 300 * time.Millisecond
	saved := tunnelKeepAliveAfter
	tunnelKeepAliveAfter = idle / 6 // read by startTunnel
	h, c, ended := floodingTunnel(t, idle)
	defer func() {
		// Restored once the tunnel is gone: its end takes the tracker's lock, as len does.
		c.Close()
		waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
		tunnelKeepAliveAfter = saved
	}()
	if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(hangGuard):
		t.Fatalf("tunnel still open %v after its last byte (idle timeout %v, keep-alive after %v)",
			hangGuard, idle, idle/6)
	}
}

// zeros reads as an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestTunnelSlowReaderIsNotIdle: a download that the client reads slowly but steadily
// moves bytes all the time, so the tunnel idle timeout must not cut it, even when one
// spliced chunk takes longer than the timeout to reach the client.
func TestTunnelSlowReaderIsNotIdle(t *testing.T) {
	const idle = 500 * time.Millisecond
	_, tc, cut := floodingTunnel(t, idle)
	// 16 KiB every 10 ms (about 1.6 MB/s) for six idle timeouts: progress all the
	// time, yet slower than loopback fills a 1 MiB splice. What the client has not read
	// yet is mostly in the kernel's buffers, so a cut shows at the upstream first.
	buf := make([]byte, 16<<10)
	got := 0
	for end := time.Now().Add(6 * idle); time.Now().Before(end); {
		n, err := io.ReadFull(tc, buf)
		got += n
		if err != nil {
			t.Fatalf("read after %d bytes: %v", got, err)
		}
		select {
		case <-cut:
			t.Fatalf("tunnel cut as idle while the client read steadily (%d bytes read)", got)
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
}
