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
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/upclient"
)

// rawUpstream listens on ip, and on each connection reads one request head, writes
// answer and then closes the connection, or (hold) keeps it open without reading until
// the test ends.
func rawUpstream(t *testing.T, ip, answer string, hold bool) int {
	t.Helper()
	return serveTCP(t, ip, func(c net.Conn, done <-chan struct{}) {
		br := bufio.NewReader(c)
		for {
			if l, err := br.ReadString('\n'); err != nil || l == "\r\n" {
				break
			}
		}
		_, _ = io.WriteString(c, answer)
		if hold {
			<-done
		}
	}).Port
}

// TestEarlyAnswerWhileBodyStreams: an upstream that answers before it read the body
// leaves the transport copying the body on its own goroutine after the request is
// done; the front must end that body before the connection's reader is reused or
// pooled (it once crashed the process here).
func TestEarlyAnswerWhileBodyStreams(t *testing.T) {
	h := newHarness(t)
	h.dns.set("early.test", netip.MustParseAddr("127.0.0.5"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["early.test","a.test"]}`)
	port := rawUpstream(t, "127.0.0.5", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true)
	for range 8 {
		c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "POST http://early.test:%d/ HTTP/1.1\r\nHost: early.test:%d\r\nContent-Length: 100000000\r\n\r\n", port, port)
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			chunk := []byte(strings.Repeat("x", 64<<10))
			for {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "ok" {
			t.Fatalf("early answer: %d %q", resp.StatusCode, body)
		}
		<-sent
		c.Close()
		// Other connections take the pooled readers meanwhile.
		for range 3 {
			if status, _, _ := h.get("http://" + h.a.httpHostPort("a.test") + "/"); status != http.StatusOK {
				t.Fatalf("a request after the early answer: %d", status)
			}
		}
	}
}

// TestContinueThenFinalAnswer: an upstream that sends "100 Continue" and its final
// answer in one write. The client's "100 Continue" (sent when the transport reads the
// body) and the final answer must not interleave or follow each other out of order.
func TestContinueThenFinalAnswer(t *testing.T) {
	h := newHarness(t)
	h.dns.set("cont.test", netip.MustParseAddr("127.0.0.6"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["cont.test"]}`)
	port := rawUpstream(t, "127.0.0.6", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true)
	for range 20 {
		c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(hangGuard))
		fmt.Fprintf(c, "POST http://cont.test:%d/ HTTP/1.1\r\nHost: cont.test:%d\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: 5\r\n\r\n", port, port)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err == nil && resp.StatusCode == http.StatusContinue {
			_, _ = io.WriteString(c, "hello")
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		rest, _ := io.ReadAll(br)
		if resp.StatusCode != http.StatusOK || string(body) != "ok" || len(rest) != 0 {
			t.Fatalf("final answer %d %q, then %q", resp.StatusCode, body, rest)
		}
		c.Close()
	}
}

// TestUnrelayedSwitchClosesConnection: a 101 that is not the websocket switch the
// request asked for is not relayed (goproxy would stream it one way, unbounded) but
// answered 502; the connection must not then carry another request.
func TestUnrelayedSwitchClosesConnection(t *testing.T) {
	h := newHarness(t)
	h.dns.set("up.test", netip.MustParseAddr("127.0.0.8"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["up.test","a.test"]}`)
	port := rawUpstream(t, "127.0.0.8", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\nRAW", false)
	c := h.dialProxy(t)
	a := h.a.httpHostPort("a.test")
	fmt.Fprintf(c, "GET http://up.test:%d/ HTTP/1.1\r\nHost: up.test:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", port, port, a, a)
	out, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(out), "HTTP/1.1 502 ") || !strings.Contains(string(out), "X-Compass-Egress: error; reason=upstream-failed\r\n") {
		t.Fatalf("a 101 to another protocol than the websocket asked for was not refused: %q", out)
	}
	if strings.Contains(string(out), "HTTP/1.1 200") {
		t.Fatalf("the connection carried a request after a failed upgrade: %q", out)
	}
}

// An upstream chunked body that breaks off must reach the client broken off too: no
// last chunk, and the connection closed.
func TestBrokenOffAnswerIsNotEndedAsWhole(t *testing.T) {
	h := newHarness(t)
	h.dns.set("trunc.test", netip.MustParseAddr("127.0.0.10"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["trunc.test"]}`)
	port := rawUpstream(t, "127.0.0.10", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", false)
	c := h.dialProxy(t)
	fmt.Fprintf(c, "GET http://trunc.test:%d/ HTTP/1.1\r\nHost: trunc.test:%d\r\n\r\n", port, port)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("the client read a whole answer %q, want a broken-off one", body)
	}
}

// An allowed request whose upstream cannot be dialled is a 502 that says so, as for a
// tunnel, not goproxy's 500 with the error's text.
func TestHTTPDialFailureIs502(t *testing.T) {
	h := newHarness(t)
	h.dns.set("closed.test", netip.MustParseAddr("127.0.0.11"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["closed.test"]}`)
	ln, err := net.Listen("tcp", "127.0.0.11:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	out := h.raw(fmt.Sprintf("GET http://closed.test:%d/ HTTP/1.1\r\nHost: closed.test:%d\r\nConnection: close\r\n\r\n", port, port))
	if !strings.HasPrefix(out, "HTTP/1.1 502 ") || !strings.Contains(out, "X-Compass-Egress: error; reason=dial-failed\r\n") {
		t.Fatalf("answer:\n%s", out)
	}
}

// upstreamAnswer tells a refusal (the swap's re-check refused the connection's
// address) and a cut request from an upstream failure.
func TestUpstreamAnswerTellsRefusalsFromFailures(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	v := &Verdict{Host: "a.test", Name: "a.test", Port: 80, Allowed: true}
	for _, tc := range []struct {
		name       string
		err        error
		refused    bool
		cancelled  bool
		wantStatus int
		wantHeader string
		wantWarn   bool
	}{
		{"upstream client re-check", upclient.ErrRecheckFailed, false, false, 403, "denied; reason=policy-changed", false},
		{"transport re-check", errors.New("use of closed network connection"), true, false, 403, "denied; reason=policy-changed", false},
		{"upstream failure", errors.New("connection reset by peer"), false, false, 502, "error; reason=upstream-failed", true},
		{"cut request", context.Canceled, false, true, 502, "error; reason=upstream-failed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancelled {
				cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
			req.RemoteAddr = "127.0.0.1:1"
			st := &requestState{}
			st.refusedConn.Store(tc.refused)
			before := strings.Count(h.logs.String(), `"msg":"upstream failed"`)
			resp, err := h.srv.upstreamAnswer(req, st, v, nil, tc.err)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.wantStatus || !strings.HasPrefix(resp.Header.Get("X-Compass-Egress"), tc.wantHeader) {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), tc.wantStatus, tc.wantHeader)
			}
			if warned := strings.Count(h.logs.String(), `"msg":"upstream failed"`) > before; warned != tc.wantWarn {
				t.Fatalf("warned %v, want %v", warned, tc.wantWarn)
			}
		})
	}
}
