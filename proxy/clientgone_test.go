package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

const testWatchDelay = 50 * time.Millisecond

// A client that leaves while its request waits for an answer head that does not come
// ends the request: the upstream connection closes at once (not after the tunnel idle
// timeout of 15 minutes), the request's slot and gauge are given back, and one INFO line
// says the client left. A half-close counts as leaving, as in squid's default and
// net/http's server.
func TestClientGoneEndsTheRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(*net.TCPConn) error
	}{
		{"close", (*net.TCPConn).Close},
		{"half-close", (*net.TCPConn).CloseWrite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.clientWatchDelay = testWatchDelay })
			port, closed := quietUpstream(t, h, func(net.Conn, []byte) bool { return false })
			c := h.dialProxy(t)
			if _, err := io.WriteString(c, quietRequest(http.MethodGet, port, "", "")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(4 * testWatchDelay)
			if err := tc.leave(c.(*net.TCPConn)); err != nil {
				t.Fatal(err)
			}
			upstreamClosed(t, closed)
			waitFor(t, func() bool {
				return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 && h.srv.tracker.len() == 0 &&
					strings.Contains(h.logs.String(), `"msg":"client gone"`)
			})
		})
	}
}

// The watch reads the first byte of a request the client pipelines behind one that
// waits past the delay; the byte is the next head's, and both requests reach the
// upstream as sent and are answered in order on the connection.
func TestWatchKeepsAPipelinedRequest(t *testing.T) {
	h, port, seen := slowEchoUpstream(t)
	c := h.dialProxy(t)
	for i, path := range []string{"/first", "/second"} {
		if _, err := io.WriteString(c, slowRequest(port, path)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			time.Sleep(3 * testWatchDelay) // the watch is reading
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	br := bufio.NewReader(c)
	for _, want := range []string{"/first", "/second"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer for %s: %v", want, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Fatalf("answer for %s: %d %q", want, resp.StatusCode, body)
		}
		if got := <-seen; got != "GET "+want {
			t.Fatalf("the upstream got %q, want GET %s", got, want)
		}
	}
	if strings.Contains(h.logs.String(), `"msg":"client gone"`) {
		t.Fatal("a pipelined request was taken for a client that left")
	}
}

// A client that pipelines two requests in one write and then half-closes: the first is
// answered (a next request already read says the client is there, so it is not
// watched), and the second, watched, ends with the connection's end: its 502 names the
// client, not the upstream.
func TestHalfCloseAfterPipelinedRequests(t *testing.T) {
	h, port, _ := slowEchoUpstream(t)
	c := h.dialProxy(t)
	reqs := ""
	for _, path := range []string{"/first", "/second"} {
		reqs += slowRequest(port, path)
	}
	if _, err := io.WriteString(c, reqs); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	br := bufio.NewReader(c)
	for _, want := range []struct {
		status int
		body   string
		header string
	}{{http.StatusOK, "/first", ""}, {http.StatusBadGateway, "", "error; reason=client-gone"}} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", want.status, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want.status || resp.Header.Get("X-Compass-Egress") != want.header || want.body != "" && string(body) != want.body {
			t.Fatalf("answer %d %q %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body, want.status, want.header)
		}
	}
}

// slowEchoUpstream serves slow.test (allowed, with the watch's delay lowered to
// testWatchDelay): each request is answered after six delays with its path as the
// body, and its method and path go to seen (two fit unread).
func slowEchoUpstream(t *testing.T) (h *harness, port int, seen <-chan string) {
	h = newHarness(t, func(c *Config) { c.clientWatchDelay = testWatchDelay })
	h.dns.set("slow.test", netip.MustParseAddr("127.0.0.23"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)
	got := make(chan string, 2)
	port = serveRawHTTP(t, "127.0.0.23", func(c net.Conn, req *http.Request) bool {
		select {
		case got <- req.Method + " " + req.URL.Path:
		default:
		}
		time.Sleep(6 * testWatchDelay)
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(req.URL.Path))+"\r\n\r\n"+req.URL.Path)
		return err == nil
	}).Port
	return h, port, got
}

func slowRequest(port int, path string) string {
	return fmt.Sprintf("GET http://slow.test:%d%s HTTP/1.1\r\nHost: slow.test:%d\r\n\r\n", port, path, port)
}
