package proxy

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestTunnelSlowReaderIsNotIdle: a download that the client reads slowly but steadily
// moves bytes all the time, so the tunnel idle timeout must not cut it, even when one
// spliced chunk takes longer than the timeout to reach the client.
func TestTunnelSlowReaderIsNotIdle(t *testing.T) {
	const idle = 500 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)
	cut := make(chan struct{})
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		defer close(cut)
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
