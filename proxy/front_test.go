package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// keepAliveGET opens a connection to the proxy, fetches a.test's page on it and
// returns it open (keep-alive), with its reader.
func keepAliveGET(t *testing.T, h *harness) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := h.dialProxy(t)
	target := h.a.httpHostPort("a.test")
	fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET: status %d, close %v", resp.StatusCode, resp.Close)
	}
	return c, br
}

// TestConnectAfterRequest: a CONNECT that follows a request on a keep-alive connection
// tunnels as a connection's first one does: it carries its early bytes, half-closes,
// and a refused one gets the same 403.
func TestConnectAfterRequest(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	c, br := keepAliveGET(t, h)
	target := h.a.echoHostPort("a.test")
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nearly-", target, target)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT after GET: %v %v", resp, err)
	}
	_, _ = io.WriteString(c, "late")
	_ = c.(*net.TCPConn).CloseWrite()
	if out, err := io.ReadAll(br); err != nil || string(out) != "early-late|eof after 10" {
		t.Fatalf("tunnel after GET echoed %q, %v", out, err)
	}

	c, br = keepAliveGET(t, h)
	blocked := h.b.echoHostPort("b.test")
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", blocked, blocked)
	resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(resp.Header.Get("X-Compass-Egress"), "denied; reason=") {
		t.Fatalf("blocked CONNECT after GET: %d %q", resp.StatusCode, resp.Header.Get("X-Compass-Egress"))
	}
}

// TestFrontRefusesBadConnect: a CONNECT head net/http's server would refuse is refused
// by the front too, and a head beyond the size bound gets 431.
func TestFrontRefusesBadConnect(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	target := h.a.echoHostPort("a.test")
	for _, tc := range []struct {
		name, req, want string
	}{
		{"two Host headers", "CONNECT " + target + " HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "HTTP/1.1 400 "},
		{"malformed request line", "CONNECT " + target + "\r\n\r\n", "HTTP/1.1 400 "},
		{"bad header line", "CONNECT " + target + " HTTP/1.1\r\nno colon here\r\n\r\n", "HTTP/1.1 400 "},
		{"head too large", "CONNECT " + target + " HTTP/1.1\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", "HTTP/1.1 431 "},
		{"no port", "CONNECT a.test HTTP/1.1\r\n\r\n", "HTTP/1.1 403 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := h.raw(tc.req); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("answer %q, want prefix %q", got, tc.want)
			}
		})
	}
}

// TestDrainWakesHalfReadHead: a client that sent part of a CONNECT head when the drain
// began is told 503 and closed at once, instead of holding the drain for its header
// timeout (an hour here: a drain that waited for it would time the test out).
func TestDrainWakesHalfReadHead(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = time.Hour })
	h.apply(`"public"`)
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "CONNECT a.te"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return h.srv.front.Conns() == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(out), "HTTP/1.1 503 ") || !strings.Contains(string(out), "reason=draining") {
		t.Fatalf("half-read client got %q", out)
	}
}

// TestDrainClosesIdleConnectionSilently: a keep-alive connection waiting for its next
// request is closed by the drain without an answer nobody asked for.
func TestDrainClosesIdleConnectionSilently(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	_, br := keepAliveGET(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("idle connection got %q at the drain", rest)
	}
	// The drain leaves no socket behind for the next start to find stale.
	if _, err := os.Lstat(h.socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("admin socket after the drain: %v", err)
	}
}

// TestDrainCutsRequestWaitingForUpstream: at the drain deadline a request still
// waiting for its upstream is cancelled, upstream exchange included, so Shutdown
// returns. (Without that it waited for an upstream that never answers: the bound
// below is twenty times the drain deadline.)
func TestDrainCutsRequestWaitingForUpstream(t *testing.T) {
	h := newHarness(t)
	h.dns.set("silent.test", netip.MustParseAddr("127.0.0.7"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["silent.test"]}`)
	port := rawUpstream(t, "127.0.0.7", "", true)
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://silent.test:%d/ HTTP/1.1\r\nHost: silent.test:%d\r\n\r\n", port, port)
	waitFor(t, func() bool { return h.srv.tracker.len() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.srv.Shutdown(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown still waits for a silent upstream")
	}
}
