package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/upclient"
)

// countingUpstream is an HTTP server on 127.0.0.2 (a.test) that counts the
// connections it accepted and closed.
type countingUpstream struct {
	srv            *http.Server
	port           int
	opened, closed atomic.Int64
}

func startCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	u := &countingUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	u.port = ln.Addr().(*net.TCPAddr).Port
	u.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				u.opened.Add(1)
			case http.StateClosed:
				u.closed.Add(1)
			}
		},
		ReadHeaderTimeout: 5 * time.Second,
	}
	go u.srv.Serve(ln)
	t.Cleanup(func() { u.srv.Close() })
	return u
}

func (u *countingUpstream) get(t *testing.T, h *harness) {
	t.Helper()
	if status, _, body := h.get(fmt.Sprintf("http://a.test:%d/", u.port)); status != http.StatusOK || body != "ok" {
		t.Fatalf("GET: %d %q", status, body)
	}
}

// TestUpstreamConnectionReused: requests without a body share one pooled upstream
// connection.
func TestUpstreamConnectionReused(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	u := startCountingUpstream(t)
	for range 5 {
		u.get(t, h)
	}
	if n := u.opened.Load(); n != 1 {
		t.Fatalf("5 requests opened %d upstream connections, want 1", n)
	}
}

// TestUpstreamClosedPooledConnection: an upstream that closed a pooled connection
// while it was idle costs the next request nothing: it is sent again on a new one.
func TestUpstreamClosedPooledConnection(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	u := startCountingUpstream(t)
	u.get(t, h)
	u.srv.SetKeepAlivesEnabled(false) // closes the idle connection, answers "close" from now on
	waitFor(t, func() bool { return u.closed.Load() == 1 })
	u.get(t, h)
	u.get(t, h)
	if n := u.opened.Load(); n != 3 {
		t.Fatalf("upstream connections opened: %d, want 3 (one closed while idle, then one per answer marked close)", n)
	}
}

// TestUpstreamIdleConnectionExpires: a pooled connection idle for the idle timeout is
// closed by the proxy.
func TestUpstreamIdleConnectionExpires(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	u := startCountingUpstream(t)
	u.get(t, h)
	h.client.CloseIdleConnections()
	waitFor(t, func() bool { return u.closed.Load() == 1 })
}

// An upstream that answers on a pooled connection while it is idle (a 408 before it
// hangs up) must not have that answer taken for the next request's.
func TestPooledConnectionAnsweredWhileIdleIsNotReused(t *testing.T) {
	h := newHarness(t)
	h.dns.set("idle408.test", netip.MustParseAddr("127.0.0.8"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["idle408.test"]}`)
	var conns atomic.Int64
	port := serveTCP(t, "127.0.0.8", func(c net.Conn, _ <-chan struct{}) {
		conns.Add(1)
		if readHead(bufio.NewReader(c)) != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	}).Port
	url := fmt.Sprintf("http://idle408.test:%d/", port)
	if st, _, body := h.get(url); st != 200 || body != "fresh" {
		t.Fatalf("first request: %d %q", st, body)
	}
	time.Sleep(300 * time.Millisecond)
	if st, _, body := h.get(url); st != 200 || body != "fresh" {
		t.Fatalf("second request: %d %q, want the answer of a new connection (200 fresh)", st, body)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("upstream connections: %d, want 2", n)
	}
}

// An upstream's answer head is bounded, interim answers included: the proxy stops
// reading and closes the connection instead of buffering without end.
func TestUpstreamAnswerHeadIsBounded(t *testing.T) {
	for _, tc := range []struct{ name, first, repeat string }{
		{"endless interim answers", "", "HTTP/1.1 103 Early Hints\r\nLink: <" + strings.Repeat("x", 4000) + ">\r\n\r\n"},
		{"endless header line", "HTTP/1.1 200 OK\r\nX-Long: ", strings.Repeat("y", 4096)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.dns.set("info.test", netip.MustParseAddr("127.0.0.9"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["info.test"]}`)
			// Far past the bound and the sockets' buffers, which take megabytes
			// before a write to a closed connection fails.
			const limit = 64 << 20
			var written atomic.Int64
			stopped := make(chan struct{})
			port := serveTCP(t, "127.0.0.9", func(c net.Conn, done <-chan struct{}) {
				defer close(stopped)
				if readHead(bufio.NewReader(c)) != nil {
					return
				}
				_, _ = io.WriteString(c, tc.first)
				for written.Load() < limit {
					_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
					n, err := io.WriteString(c, tc.repeat)
					written.Add(int64(n))
					if err != nil {
						return
					}
				}
			}).Port
			c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(c, "GET http://info.test:%d/ HTTP/1.1\r\nHost: info.test:%d\r\n\r\n", port, port)
			select {
			case <-stopped:
			case <-time.After(20 * time.Second):
				t.Fatal("the upstream still writes after 20 s")
			}
			if n := written.Load(); n >= limit {
				t.Fatalf("the proxy read %d MiB of answer head, want at most about %d KiB", n>>20, upclient.MaxAnswerHeadBytes>>10)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", resp.StatusCode)
			}
		})
	}
}
