package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
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
