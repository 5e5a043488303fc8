package upclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/internal/tcptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var loopback = netip.MustParseAddr("127.0.0.1")

// dialer dials a target's first address, as the proxy's dialer would once the
// decision checked it, and counts its dials.
type dialer struct{ dials atomic.Int64 }

func (d *dialer) DialUpstream(ctx context.Context, t Target) (*net.TCPConn, netip.Addr, error) {
	d.dials.Add(1)
	c, err := (&net.Dialer{KeepAlive: -1}).DialContext(ctx, "tcp", netip.AddrPortFrom(t.Addrs[0], t.Port).String())
	if err != nil {
		return nil, netip.Addr{}, err
	}
	return c.(*net.TCPConn), t.Addrs[0], nil
}

// newClient is a client over a fresh dialer, with an hour's idle timeouts unless cfg
// sets its own; the cleanup closes its idle connections.
func newClient(t *testing.T, cfg Config) (*Client, *dialer) {
	d := &dialer{}
	cfg.Dialer = d
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = time.Hour
	}
	if cfg.ReadIdleTimeout == 0 {
		cfg.ReadIdleTimeout = time.Hour
	}
	u := New(cfg)
	t.Cleanup(u.CloseIdle)
	return u, d
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, cond)
}

// serveTCP serves the loopback (see tcptest.Serve) and returns its port.
func serveTCP(t *testing.T, handle func(c net.Conn, done <-chan struct{})) uint16 {
	t.Helper()
	return uint16(tcptest.Serve(t, "127.0.0.1", handle).Port)
}

// keepAliveUpstream answers every request of a connection "ok" and keeps it open; it
// counts connections, requests and connections the client closed.
func keepAliveUpstream(t *testing.T, conns, requests, closed *atomic.Int64) uint16 {
	return serveTCP(t, func(c net.Conn, _ <-chan struct{}) {
		defer closed.Add(1)
		conns.Add(1)
		br := bufio.NewReader(c)
		for tcptest.ReadHead(br) == nil {
			requests.Add(1)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
}

func target(port uint16) Target {
	return Target{Host: "a.test", Addrs: []netip.Addr{loopback}, Port: port}
}

func allowAll(net.Conn) bool { return true }

// get sends a GET to port through u, reads its answer to its end and returns its
// status and body, or the round trip's error.
func get(u *Client, port uint16) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://a.test:%d/", port), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := u.RoundTrip(req, target(port), allowAll)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func mustGet(t *testing.T, u *Client, port uint16) {
	t.Helper()
	if st, body, err := get(u, port); err != nil || st != http.StatusOK || body != "ok" {
		t.Fatalf("GET: %d %q %v", st, body, err)
	}
}

// idleCount is the idle connections of u's pool, and what u counts of them.
func idleCount(u *Client) (listed, counted int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, l := range u.idle {
		listed += len(l)
	}
	return listed, u.nidle
}

// The pool's count of idle connections (which bounds it across upstreams) follows the
// pool through reuse, expiry and a swap's close: a count that drifts up would refuse to
// pool anything once it reached the bound, one that drifts down would lift the bound.
func TestIdlePoolCountFollowsThePool(t *testing.T) {
	var conns, requests, closed atomic.Int64
	u, _ := newClient(t, Config{})
	port := keepAliveUpstream(t, &conns, &requests, &closed)
	for i := range 4 {
		mustGet(t, u, port)
		// The connection goes back to the pool once its answer was read to its end.
		waitFor(t, func() bool { l, _ := idleCount(u); return l == 1 })
		if listed, counted := idleCount(u); counted != listed || u.IdleConns() != counted {
			t.Fatalf("after request %d: %d idle connections, counted %d, reported %d", i, listed, counted, u.IdleConns())
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("4 requests used %d upstream connections, want 1", n)
	}
	u.CloseIdle()
	if listed, counted := idleCount(u); listed != 0 || counted != 0 {
		t.Fatalf("after CloseIdle the pool has %d idle connections, counted %d; want none", listed, counted)
	}
	waitFor(t, func() bool { return closed.Load() == 1 })
}

// A pooled connection that idles out leaves the pool and its count.
func TestExpiredConnectionLeavesTheCount(t *testing.T) {
	var conns, requests, closed atomic.Int64
	u, _ := newClient(t, Config{IdleTimeout: 100 * time.Millisecond})
	port := keepAliveUpstream(t, &conns, &requests, &closed)
	mustGet(t, u, port)
	waitFor(t, func() bool { l, c := idleCount(u); return l == 0 && c == 0 && requests.Load() == 1 })
	waitFor(t, func() bool { return closed.Load() == 1 })
}

// A request sent on a pooled connection that gets no answer head for the read idle
// timeout fails: it is not sent again on a new connection, which would double the
// bound and send the request twice to an upstream that may be working on it.
func TestHeadIdleOnPooledConnectionIsNotRetried(t *testing.T) {
	var conns, requests atomic.Int64
	u, d := newClient(t, Config{ReadIdleTimeout: 300 * time.Millisecond})
	port := serveTCP(t, func(c net.Conn, done <-chan struct{}) {
		n := conns.Add(1)
		br := bufio.NewReader(c)
		for tcptest.ReadHead(br) == nil {
			requests.Add(1)
			if n > 1 || requests.Load() > 1 {
				<-done // silent from the second request on
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	mustGet(t, u, port)
	waitFor(t, func() bool { l, _ := idleCount(u); return l == 1 })
	if st, _, err := get(u, port); !errors.Is(err, connio.ErrUpstreamHeadIdle) {
		t.Fatalf("second GET: %d %v, want %v", st, err, connio.ErrUpstreamHeadIdle)
	}
	if c, r, n := conns.Load(), requests.Load(), d.dials.Load(); c != 1 || r != 2 || n != 1 {
		t.Fatalf("upstream saw %d connections and %d requests (%d dials), want 1 and 2 (1)", c, r, n)
	}
}

// A request's connection, a pooled one included, is checked before the request is
// written (a swap may have come since the decision): one the check refuses carries
// nothing and is closed.
func TestPooledConnectionCheckedBeforeWrite(t *testing.T) {
	var conns, requests, closed atomic.Int64
	u, _ := newClient(t, Config{})
	port := keepAliveUpstream(t, &conns, &requests, &closed)
	mustGet(t, u, port)
	waitFor(t, func() bool { l, _ := idleCount(u); return l == 1 })
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://a.test:%d/", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	var checked net.Conn
	resp, err := u.RoundTrip(req, target(port), func(c net.Conn) bool { checked = c; return false })
	if resp != nil || !errors.Is(err, ErrRecheckFailed) || checked == nil {
		t.Fatalf("RoundTrip on a refused connection: %v, %v (checked %v)", resp, err, checked)
	}
	if _, err := checked.Write([]byte("x")); err == nil {
		t.Error("the refused connection is still open")
	}
	if r := requests.Load(); r != 1 {
		t.Fatalf("upstream saw %d requests, want 1", r)
	}
}

// A connection is pooled only when both ends mean to keep it: not after an answer
// marked Connection: close (even if the upstream leaves it open), and not with bytes
// past the answer's end, which the next request would read as its answer.
func TestConnectionPooledOnlyInStep(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
	}{
		{"answer says close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		{"bytes past the answer", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conns atomic.Int64
			u, _ := newClient(t, Config{})
			port := serveTCP(t, func(c net.Conn, _ <-chan struct{}) {
				conns.Add(1)
				br := bufio.NewReader(c)
				for tcptest.ReadHead(br) == nil {
					_, _ = io.WriteString(c, tc.answer)
				}
			})
			for range 2 {
				mustGet(t, u, port)
			}
			if n := conns.Load(); n != 2 {
				t.Fatalf("2 requests used %d upstream connections, want 2", n)
			}
		})
	}
}

// The pool keeps at most MaxIdlePerUpstream idle connections to one upstream address.
func TestIdlePoolIsBoundedPerUpstream(t *testing.T) {
	const n = MaxIdlePerUpstream + 2
	u, _ := newClient(t, Config{})
	var arrived, closed atomic.Int64
	all := make(chan struct{})
	port := serveTCP(t, func(c net.Conn, done <-chan struct{}) {
		defer closed.Add(1) // the client closed it (or the test ended)
		br := bufio.NewReader(c)
		for tcptest.ReadHead(br) == nil {
			// Every request waits for all n to arrive: n connections at once.
			if arrived.Add(1) == n {
				close(all)
			}
			select {
			case <-all:
			case <-done:
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	errs := make(chan error, n)
	for range n {
		go func() {
			_, _, err := get(u, port)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	key := netip.AddrPortFrom(loopback, port)
	// Each connection goes back to the pool, or is closed, once its answer was read.
	waitFor(t, func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return len(u.idle[key])+int(closed.Load()) == n
	})
	u.mu.Lock()
	defer u.mu.Unlock()
	if got := len(u.idle[key]); got != MaxIdlePerUpstream {
		t.Fatalf("%d idle connections to one upstream, want %d", got, MaxIdlePerUpstream)
	}
}

// The idle pool is bounded across upstreams, not only per upstream.
func TestIdlePoolIsBoundedAcrossUpstreams(t *testing.T) {
	u, _ := newClient(t, Config{})
	for i := range MaxIdle + 20 {
		port := serveTCP(t, func(c net.Conn, _ <-chan struct{}) {
			br := bufio.NewReader(c)
			for tcptest.ReadHead(br) == nil {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		if st, body, err := get(u, port); err != nil || st != 200 || body != "ok" {
			t.Fatalf("GET %d: %d %q %v", i, st, body, err)
		}
	}
	if idle, counted := idleCount(u); idle != MaxIdle || counted != idle {
		t.Fatalf("idle connections: %d (counted %d), want %d", idle, counted, MaxIdle)
	}
}

// The bounds docs/proxy.md states for an upstream's answer heads: five interim answers,
// 64 KiB of heads. Tests elsewhere derive their inputs from the constants, so a change of
// a constant alone would pass them.
func TestDocumentedAnswerBounds(t *testing.T) {
	if MaxInterimAnswers != 5 || MaxAnswerHeadBytes != 64<<10 {
		t.Fatalf("interim answers %d, head bytes %d; docs/proxy.md says 5 and 64 KiB", MaxInterimAnswers, MaxAnswerHeadBytes)
	}
}

// Which requests the client carries: plain http, no body, no Upgrade, and a method
// that may be sent twice (it retries one on a new connection). Any other goes to
// net/http's Transport, which speaks TLS and does not resend what is not idempotent.
func TestHandles(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		body        io.Reader
		upgrade     bool
		want        bool
	}{
		{"GET", "http://a.test/", nil, false, true},
		{"HEAD", "http://a.test/", nil, false, true},
		{"OPTIONS", "http://a.test/", nil, false, true},
		{"TRACE", "http://a.test/", nil, false, true},
		{"GET", "https://a.test/", nil, false, false},
		{"GET", "http://a.test/", strings.NewReader("x"), false, false},
		{"GET", "http://a.test/", nil, true, false},
		{"POST", "http://a.test/", nil, false, false},
		{"DELETE", "http://a.test/", nil, false, false},
		{"PUT", "http://a.test/", nil, false, false},
		{"PATCH", "http://a.test/", nil, false, false},
	} {
		req, err := http.NewRequest(tc.method, tc.url, tc.body)
		if err != nil {
			t.Fatal(err)
		}
		if tc.body == nil {
			req.Body = http.NoBody
		}
		if tc.upgrade {
			req.Header.Set("Upgrade", "websocket")
		}
		if got := Handles(req); got != tc.want {
			t.Errorf("%s %s (body %v, upgrade %v): Handles %v, want %v", tc.method, tc.url, tc.body != nil, tc.upgrade, got, tc.want)
		}
	}
}
