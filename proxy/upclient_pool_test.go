package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	neturl "net/url"
	"sync/atomic"
	"testing"
	"time"
)

// keepAliveUpstream answers every request of a connection "ok" and keeps it open; it
// counts connections, requests and connections the proxy closed.
func keepAliveUpstream(t *testing.T, conns, requests, closed *atomic.Int64) int {
	return serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		defer closed.Add(1)
		conns.Add(1)
		br := bufio.NewReader(c)
		for readHead(br) == nil {
			requests.Add(1)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}).Port
}

// idleCount is the idle connections of u's pool, and what u counts of them.
func idleCount(u *upstreamClient) (listed, counted int) {
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
	h := newHarness(t, func(c *Config) { c.IdleTimeout = time.Hour })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := keepAliveUpstream(t, &conns, &requests, &closed)
	url := fmt.Sprintf("http://a.test:%d/", port)
	u := h.srv.current.Load().upstream
	for i := range 4 {
		if st, _, body := h.get(url); st != http.StatusOK || body != "ok" {
			t.Fatalf("GET %d: %d %q", i, st, body)
		}
		// The connection goes back to the pool once its answer was read to its end.
		waitFor(t, func() bool { l, _ := idleCount(u); return l == 1 })
		if listed, counted := idleCount(u); counted != listed {
			t.Fatalf("after request %d: %d idle connections, counted %d", i, listed, counted)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("4 requests used %d upstream connections, want 1", n)
	}
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test"]}`)
	if listed, counted := idleCount(u); listed != 0 || counted != 0 {
		t.Fatalf("after a swap the old pool has %d idle connections, counted %d; want none", listed, counted)
	}
	waitFor(t, func() bool { return closed.Load() == 1 })
}

// A pooled connection that idles out leaves the pool and its count.
func TestExpiredConnectionLeavesTheCount(t *testing.T) {
	var conns, requests, closed atomic.Int64
	h := newHarness(t, func(c *Config) { c.IdleTimeout = 100 * time.Millisecond })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := keepAliveUpstream(t, &conns, &requests, &closed)
	if st, _, _ := h.get(fmt.Sprintf("http://a.test:%d/", port)); st != http.StatusOK {
		t.Fatalf("GET: %d", st)
	}
	u := h.srv.current.Load().upstream
	waitFor(t, func() bool { l, c := idleCount(u); return l == 0 && c == 0 && requests.Load() == 1 })
}

// A request sent on a pooled connection that gets no answer head for the tunnel idle
// timeout fails: it is not sent again on a new connection, which would double the
// bound and send the request twice to an upstream that may be working on it.
func TestHeadIdleOnPooledConnectionIsNotRetried(t *testing.T) {
	var conns, requests atomic.Int64
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = 300 * time.Millisecond })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		n := conns.Add(1)
		br := bufio.NewReader(c)
		for readHead(br) == nil {
			requests.Add(1)
			if n > 1 || requests.Load() > 1 {
				<-done // silent from the second request on
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}).Port
	url := fmt.Sprintf("http://a.test:%d/", port)
	if st, _, _ := h.get(url); st != http.StatusOK {
		t.Fatalf("first GET: %d", st)
	}
	u := h.srv.current.Load().upstream
	waitFor(t, func() bool { l, _ := idleCount(u); return l == 1 })
	if st, _, _ := h.get(url); st == http.StatusOK {
		t.Fatalf("second GET: %d, want a failure", st)
	}
	if c, r := conns.Load(), requests.Load(); c != 1 || r != 2 {
		t.Fatalf("upstream saw %d connections and %d requests, want 1 and 2", c, r)
	}
}

// A request's connection, a pooled one included, is checked before the request is
// written (a swap may have come since the decision): one the check refuses carries
// nothing and is closed.
func TestPooledConnectionCheckedBeforeWrite(t *testing.T) {
	var conns, requests, closed atomic.Int64
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := keepAliveUpstream(t, &conns, &requests, &closed)
	url := fmt.Sprintf("http://a.test:%d/", port)
	if st, _, _ := h.get(url); st != http.StatusOK {
		t.Fatalf("GET: %d", st)
	}
	u := h.srv.current.Load().upstream
	waitFor(t, func() bool { l, _ := idleCount(u); return l == 1 })
	v := &Verdict{Allowed: true, Name: "a.test", Port: uint16(port), Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}
	var checked net.Conn
	resp, err := u.roundTrip(httptest.NewRequest(http.MethodGet, url, nil), v, func(c net.Conn) bool { checked = c; return false })
	if resp != nil || !errors.Is(err, errRecheckFailed) || checked == nil {
		t.Fatalf("roundTrip on a refused connection: %v, %v (checked %v)", resp, err, checked)
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
			h := newHarness(t)
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
			port := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
				conns.Add(1)
				br := bufio.NewReader(c)
				for readHead(br) == nil {
					_, _ = io.WriteString(c, tc.answer)
				}
			}).Port
			url := fmt.Sprintf("http://a.test:%d/", port)
			for i := range 2 {
				if st, _, body := h.get(url); st != http.StatusOK || body != "ok" {
					t.Fatalf("GET %d: %d %q, want 200 ok", i, st, body)
				}
			}
			if n := conns.Load(); n != 2 {
				t.Fatalf("2 requests used %d upstream connections, want 2", n)
			}
		})
	}
}

// The pool keeps at most maxIdlePerUpstream idle connections to one upstream address.
func TestIdlePoolIsBoundedPerUpstream(t *testing.T) {
	const n = maxIdlePerUpstream + 2
	h := newHarness(t, func(c *Config) { c.IdleTimeout = time.Hour })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	var arrived, closed atomic.Int64
	all := make(chan struct{})
	port := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		defer closed.Add(1) // the proxy closed it (or the test ended)
		br := bufio.NewReader(c)
		for readHead(br) == nil {
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
	}).Port
	url := fmt.Sprintf("http://a.test:%d/", port)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&neturl.URL{Scheme: "http", Host: h.srv.ProxyAddr().String()})}}
	defer client.CloseIdleConnections()
	errs := make(chan error, n)
	for range n {
		go func() {
			resp, err := client.Get(url)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	u := h.srv.current.Load().upstream
	key := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port))
	// Each connection goes back to the pool, or is closed, after its answer reached
	// the client: wait for all of them.
	waitFor(t, func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return len(u.idle[key])+int(closed.Load()) == n
	})
	u.mu.Lock()
	defer u.mu.Unlock()
	if got := len(u.idle[key]); got != maxIdlePerUpstream {
		t.Fatalf("%d idle connections to one upstream, want %d", got, maxIdlePerUpstream)
	}
}

// The bounds docs/proxy.md states for an upstream's answer heads: five interim answers,
// 64 KiB of heads. Tests elsewhere derive their inputs from the constants, so a change of
// a constant alone would pass them.
func TestDocumentedAnswerBounds(t *testing.T) {
	if maxInterimAnswers != 5 || maxAnswerHeadBytes != 64<<10 {
		t.Fatalf("interim answers %d, head bytes %d; docs/proxy.md says 5 and 64 KiB", maxInterimAnswers, maxAnswerHeadBytes)
	}
}
