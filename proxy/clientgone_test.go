package proxy

import (
	"bufio"
	"errors"
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

// pacedUpstream serves paced.test on 127.0.0.31, with the client watch's delay lowered
// to testWatchDelay and the head timeout to headTimeout (0: the default). Each GET is
// answered with its path as the body (any other method with a 405, so that a head
// the proxy did not pass on as sent shows): at once, after six delays for a path that
// starts with /slow, never for /never, whose connection then waits for the proxy to
// close it and reports that on closed.
func pacedUpstream(t *testing.T, headTimeout time.Duration) (h *harness, port int, closed <-chan struct{}) {
	t.Helper()
	h = newHarness(t, func(c *Config) {
		c.clientWatchDelay = testWatchDelay
		c.HeaderTimeout = headTimeout
	})
	h.dns.set("paced.test", netip.MustParseAddr("127.0.0.31"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["paced.test"]}`)
	ch := make(chan struct{}, 1)
	port = serveTCP(t, "127.0.0.31", func(c net.Conn, _ <-chan struct{}) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			switch path := req.URL.Path; {
			case req.Method != http.MethodGet: // a head the proxy did not read as sent
				if _, err := io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"); err != nil {
					return
				}
			case path == "/never":
				if _, err := io.Copy(io.Discard, br); !errors.Is(err, net.ErrClosed) { // else the test's end
					select {
					case ch <- struct{}{}:
					default:
					}
				}
				return
			case strings.HasPrefix(path, "/slow"):
				time.Sleep(6 * testWatchDelay)
				fallthrough
			default:
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(path))+"\r\n\r\n"+path); err != nil {
					return
				}
			}
		}
	}).Port
	return h, port, ch
}

func pacedRequest(port int, path string) string {
	return fmt.Sprintf("GET http://paced.test:%d%s HTTP/1.1\r\nHost: paced.test:%d\r\n\r\n", port, path, port)
}

// askPaced sends a request for path on c and checks that its answer is the path.
func askPaced(t *testing.T, c net.Conn, br *bufio.Reader, port int, path string) {
	t.Helper()
	if _, err := io.WriteString(c, pacedRequest(port, path)); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	readPaced(t, br, path)
}

func readPaced(t *testing.T, br *bufio.Reader, path string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("answer for %s: %v", path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != path {
		t.Fatalf("answer for %s: %d %q %q", path, resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body)
	}
}

// The client watch is armed once per request on a kept connection, and each arming
// starts afresh: a watch that was stopped before its read (an answer quicker than the
// delay), one that read the start of a pipelined request, and one that read nothing
// leave no count, no flag and no byte behind for the next request's watch. A byte left
// behind would be put in front of the next request's head (a request the client did
// not send); a count left behind would hold the end of the next watched request for
// ever.
func TestWatchLeavesNothingBehind(t *testing.T) {
	h, port, _ := pacedUpstream(t, 0)
	c := h.dialProxy(t)
	br := bufio.NewReader(c)
	askPaced(t, c, br, port, "/fast1") // stopped before its read
	askPaced(t, c, br, port, "/slow2") // read, woken by the stop
	// Read, getting the first byte of the next request.
	if _, err := io.WriteString(c, pacedRequest(port, "/slow3")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * testWatchDelay) // the watch is reading
	if _, err := io.WriteString(c, pacedRequest(port, "/fast4")); err != nil {
		t.Fatal(err)
	}
	readPaced(t, br, "/slow3")
	readPaced(t, br, "/fast4")
	askPaced(t, c, br, port, "/slow5") // read nothing, woken by the stop
	askPaced(t, c, br, port, "/fast6")
	if strings.Contains(h.logs.String(), `"msg":"client gone"`) {
		t.Fatalf("a client that stayed was taken for gone:\n%s", h.logs.String())
	}
}

// A client that leaves while its request waits notices no less on the connection's
// later requests (the watch of an earlier one ran and was stopped), nor once the
// deadline of the request's head has passed (the watch reads without it): the upstream
// connection closes, the client is logged gone.
func TestWatchSeesALaterClientLeave(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before []string // asked first, on the same connection
	}{
		{"after a watched request", []string{"/slow1"}},
		{"after the head deadline", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const headTimeout = 4 * testWatchDelay
			h, port, closed := pacedUpstream(t, headTimeout)
			c := h.dialProxy(t)
			br := bufio.NewReader(c)
			for _, path := range tc.before {
				askPaced(t, c, br, port, path)
			}
			if _, err := io.WriteString(c, pacedRequest(port, "/never")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * headTimeout) // the watch is reading, the head's deadline has passed
			c.Close()
			select {
			case <-closed:
			case <-time.After(hangGuard):
				t.Fatalf("the upstream connection is still open %v after the client left", hangGuard)
			}
			waitFor(t, func() bool { return strings.Contains(h.logs.String(), `"msg":"client gone"`) })
		})
	}
}

// A swap that cuts a watched request closes its client connection itself: the watch's
// read then fails with the connection closed, which is the proxy's doing, not the
// client leaving, and is not logged as such.
func TestSwapCutOfAWatchedRequestIsNotClientGone(t *testing.T) {
	h, port, closed := pacedUpstream(t, 0)
	c := h.dialProxy(t)
	if _, err := io.WriteString(c, pacedRequest(port, "/never")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * testWatchDelay) // the watch is reading
	if r := h.apply(`{"network_mode":"allowlist","allowed_hosts":["other.test"]}`); r.ClosedConnections != 1 {
		t.Fatalf("the swap closed %d connections, want 1", r.ClosedConnections)
	}
	select {
	case <-closed:
	case <-time.After(hangGuard):
		t.Fatalf("the upstream connection is still open %v after the cut", hangGuard)
	}
	// The line would come before the connection's end.
	waitFor(t, func() bool {
		return h.srv.front.Conns() == 0
	})
	if strings.Contains(h.logs.String(), `"msg":"client gone"`) {
		t.Fatalf("a swap's cut logged as the client leaving:\n%s", h.logs.String())
	}
}
