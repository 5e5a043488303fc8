package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// quietUpstream serves quiet.test on 127.0.0.23: per connection it reads requests, each
// with its whole body, and hands each body to answer, which writes the answer (or not)
// and says whether to read the next request. A connection that ends otherwise waits
// for the proxy to close it, and reports when it did on closed.
func quietUpstream(t *testing.T, h *harness, answer func(c net.Conn, body []byte) bool) (port int, closed <-chan time.Time) {
	t.Helper()
	h.dns.set("quiet.test", netip.MustParseAddr("127.0.0.23"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["quiet.test"]}`)
	ch := make(chan time.Time, 1)
	port = serveTCP(t, "127.0.0.23", func(c net.Conn, _ <-chan struct{}) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			var body []byte
			if err == nil {
				body, err = io.ReadAll(req.Body)
			}
			if err == nil && answer(c, body) {
				continue
			}
			if err == nil {
				_, err = io.Copy(io.Discard, br)
			}
			if !errors.Is(err, net.ErrClosed) { // else closed by the test's end
				select {
				case ch <- time.Now():
				default:
				}
			}
			return
		}
	}).Port
	return port, ch
}

// quietRequest is a request for quiet.test: a GET goes through the upstream client, a
// POST (with body, framed by head) through net/http's Transport.
// askQuiet sends one quietRequest (a POST with a one-byte body) on a new connection and
// returns the final answer, its body unread.
func askQuiet(t *testing.T, h *harness, method string, port int) *http.Response {
	t.Helper()
	c := h.dialProxy(t)
	if _, err := io.WriteString(c, quietRequest(method, port, "Content-Length: 1\r\n", "x")); err != nil {
		t.Fatal(err)
	}
	return finalAnswer(t, bufio.NewReader(c))
}

func quietRequest(method string, port int, head, body string) string {
	if method == http.MethodGet {
		return fmt.Sprintf("GET http://quiet.test:%d/ HTTP/1.1\r\nHost: quiet.test:%d\r\n\r\n", port, port)
	}
	return fmt.Sprintf("POST http://quiet.test:%d/ HTTP/1.1\r\nHost: quiet.test:%d\r\n%s\r\n%s", port, port, head, body)
}

// idleSettled waits for the proxy to give back what the request held, and for one WARN
// line msg that names side.
func idleSettled(t *testing.T, h *harness, msg, side string) {
	t.Helper()
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 && h.srv.tracker.len() == 0
	})
	waitFor(t, func() bool {
		for _, l := range strings.Split(h.logs.String(), "\n") {
			if strings.Contains(l, `"msg":"`+msg+`"`) && strings.Contains(l, `"side":"`+side+`"`) && strings.Contains(l, `"level":"WARN"`) {
				return true
			}
		}
		return false
	})
}

func upstreamClosed(t *testing.T, closed <-chan time.Time) {
	t.Helper()
	select {
	case <-closed:
	case <-time.After(hangGuard):
		t.Fatalf("upstream connection still open %v after the request", hangGuard)
	}
}

// An upstream that reads the request and sends nothing ends the request once the
// tunnel idle timeout has passed since the request was written: the client gets a 504
// that names the reason, the upstream connection closes, the request's slot and gauge
// are given back, one WARN line says the upstream stalled.
func TestAnswerHeadThatNeverComesEnds(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			port, closed := quietUpstream(t, h, func(net.Conn, []byte) bool { return false })
			c := h.dialProxy(t)
			start := time.Now()
			if _, err := io.WriteString(c, quietRequest(method, port, "Content-Length: 1\r\n", "x")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer %v after the request: %v", time.Since(start).Round(time.Millisecond), err)
			}
			took := time.Since(start)
			if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("X-Compass-Egress") != "error; reason=upstream-timeout" {
				t.Fatalf("answer %d %q, want 504 with reason upstream-timeout", resp.StatusCode, resp.Header.Get("X-Compass-Egress"))
			}
			if took < answerIdle {
				t.Fatalf("504 after %v, before the idle timeout %v", took, answerIdle)
			}
			t.Logf("504 %v after the request", took.Round(time.Millisecond))
			upstreamClosed(t, closed)
			idleSettled(t, h, "answer idle", "upstream")
		})
	}
}

// An upstream that takes two thirds of the timeout to begin each answer is waited for:
// on a new connection, on a pooled one whose last body read left its deadline behind
// (the next request comes while that deadline is ahead, the head about when it passes),
// and through the Transport.
func TestAnswerHeadWithinIdleIsServed(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
	port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
		time.Sleep(2 * answerIdle / 3)
		// The body comes after the head, so that reading it waits on the connection
		// (and sets the body's read deadline).
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"); err != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
		_, err := io.WriteString(c, "body")
		return err == nil
	})
	c := h.dialProxy(t)
	br := bufio.NewReader(c)
	for i, method := range []string{http.MethodGet, http.MethodGet, http.MethodPost} {
		if i > 0 {
			time.Sleep(2 * answerIdle / 5)
		}
		if _, err := io.WriteString(c, quietRequest(method, port, "Content-Length: 1\r\n", "x")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, method, err)
		}
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || err != nil || string(body) != "body" {
			t.Fatalf("request %d (%s): %d %q %v", i, method, resp.StatusCode, body, err)
		}
	}
	if strings.Contains(h.logs.String(), `"msg":"answer idle"`) {
		t.Fatalf("idle logged for answers that came in time:\n%s", h.logs.String())
	}
}

// A client that sends half of a request body and stops ends the request once it sent
// nothing for the tunnel idle timeout: its connection closes unanswered, the upstream
// connection closes (its body falls short), the request's slot and gauge are given
// back, one WARN line says the client stalled.
func TestRequestBodyThatStopsEnds(t *testing.T) {
	for _, tc := range []struct{ name, head, half string }{
		{"content-length", "Content-Length: 10\r\n", "01234"},
		{"chunked", "Transfer-Encoding: chunked\r\n", "5\r\n01234\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			port, closed := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
				_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
				return err == nil
			})
			c := h.dialProxy(t)
			start := time.Now()
			if _, err := io.WriteString(c, quietRequest(http.MethodPost, port, tc.head, tc.half)); err != nil {
				t.Fatal(err)
			}
			upstreamClosed(t, closed)
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			got, err := io.ReadAll(c)
			if err != nil || len(got) != 0 {
				t.Fatalf("client read %q, %v %v after the request; want EOF unanswered", got, err, time.Since(start).Round(time.Millisecond))
			}
			if took := time.Since(start); took < answerIdle {
				t.Fatalf("ended after %v, before the idle timeout %v", took, answerIdle)
			}
			idleSettled(t, h, "request body idle", "client")
		})
	}
}

// A client that sends its body slowly but never stops for the timeout has it relayed
// whole: one byte every 100 ms, and one chunk every two thirds of the timeout (so that
// a read can outlive the deadline in force when it began, which is moved on).
func TestRequestBodyTrickleIsServed(t *testing.T) {
	const pieces = 6
	for _, tc := range []struct {
		name, head string
		every      time.Duration
		piece      func(i int) string
	}{
		{"content-length", fmt.Sprintf("Content-Length: %d\r\n", pieces), 100 * time.Millisecond, func(i int) string { return fmt.Sprint(i) }},
		{"chunked", "Transfer-Encoding: chunked\r\n", 2 * answerIdle / 3, func(i int) string { return fmt.Sprintf("1\r\n%d\r\n", i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			port, _ := quietUpstream(t, h, func(c net.Conn, body []byte) bool {
				_, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				return err == nil
			})
			c := h.dialProxy(t)
			if _, err := io.WriteString(c, quietRequest(http.MethodPost, port, tc.head, "")); err != nil {
				t.Fatal(err)
			}
			want := ""
			for i := range pieces {
				time.Sleep(tc.every)
				if _, err := io.WriteString(c, tc.piece(i)); err != nil {
					t.Fatal(err)
				}
				want += fmt.Sprint(i)
			}
			if tc.name == "chunked" {
				_, _ = io.WriteString(c, "0\r\n\r\n")
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || err != nil || string(body) != want {
				t.Fatalf("answer %d %q %v, want 200 echoing %q", resp.StatusCode, body, err, want)
			}
		})
	}
}

// An upstream that reads a request's head and then takes none of its body: the
// Transport's write of the body blocks, and its wait for the answer head starts only
// once the body is written, so before idleWriter bounded the Transport's connections
// the request held its goroutine, slot and both connections for ever. Now the write
// fails once nothing moved for the tunnel idle timeout: the client gets a 504
// upstream-timeout, the upstream connection closes, one WARN line names the side.
func TestRequestBodyTheUpstreamStopsTakingEnds(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
	h.dns.set("quiet.test", netip.MustParseAddr("127.0.0.23"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["quiet.test"]}`)
	answered, closed := make(chan struct{}), make(chan struct{})
	port := serveTCP(t, "127.0.0.23", func(c net.Conn, done <-chan struct{}) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		// Reads nothing more until the client has its answer, then reads to the end
		// the proxy must have made.
		select {
		case <-answered:
		case <-done:
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err == nil {
			close(closed)
		}
	}).Port
	c := h.dialProxy(t)
	const size = 256 << 20 // far more than the socket buffers on the way hold
	go func() {
		_, _ = fmt.Fprintf(c, "POST http://quiet.test:%d/ HTTP/1.1\r\nHost: quiet.test:%d\r\nContent-Length: %d\r\n\r\n", port, port, size)
		_, _ = io.CopyN(c, zeroReader{}, size)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	close(answered)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("X-Compass-Egress") != "error; reason=upstream-timeout" ||
		!strings.Contains(string(body), "took none of the request") {
		t.Fatalf("answer %d %q %q, want a 504 upstream-timeout", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body)
	}
	idleSettled(t, h, "request body idle", "upstream")
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream connection was not closed")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
