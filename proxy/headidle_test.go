package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/proxy/upclient"
)

// finalAnswer reads the answer to a request, past any interim ones.
func finalAnswer(t *testing.T, br *bufio.Reader) *http.Response {
	t.Helper()
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp
		}
	}
}

// An upstream that keeps a request alive with a 102 Processing every third of the
// timeout and answers after five thirds of it is served on both paths: each interim
// answer is progress. Through net/http's Transport (the POST) the wait was one timer
// for the whole head (ResponseHeaderTimeout), and the client got a 504.
func TestInterimAnswersKeepTheHeadWaitAlive(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
				for range 4 {
					time.Sleep(answerIdle / 3)
					if _, err := io.WriteString(c, "HTTP/1.1 102 Processing\r\n\r\n"); err != nil {
						return false
					}
				}
				time.Sleep(answerIdle / 3)
				_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return err == nil
			})
			c := h.dialProxy(t)
			start := time.Now()
			if _, err := io.WriteString(c, quietRequest(method, port, "Content-Length: 1\r\n", "x")); err != nil {
				t.Fatal(err)
			}
			resp := finalAnswer(t, bufio.NewReader(c))
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || err != nil || string(body) != "ok" {
				t.Fatalf("answer %d %q %q (%v) after %v, want 200 \"ok\"", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body, err,
					time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// A head whose bytes come a third of the timeout apart, for longer than the timeout
// in all, is served on both paths: every byte is progress.
func TestHeadTrickledWithinIdleIsServed(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
				for _, part := range []string{"H", "TTP/1.1 2", "00 OK\r\n", "Content-", "Length: 2", "\r\n", "\r\n", "ok"} {
					time.Sleep(answerIdle / 3)
					if _, err := io.WriteString(c, part); err != nil {
						return false
					}
				}
				return true
			})
			resp := askQuiet(t, h, method, port)
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || err != nil || string(body) != "ok" {
				t.Fatalf("answer %d %q %q (%v), want 200 \"ok\"", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body, err)
			}
		})
	}
}

// An upstream that sends one 102 Processing and then nothing ends the request once the
// timeout has passed since the 102 (not since the request was written): a 504
// upstream-timeout, the upstream connection closed, the "answer idle" line.
func TestInterimAnswerThenSilenceEnds(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			interim := make(chan time.Time, 1)
			port, closed := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
				time.Sleep(answerIdle / 2)
				if _, err := io.WriteString(c, "HTTP/1.1 102 Processing\r\n\r\n"); err == nil {
					interim <- time.Now()
				}
				return false
			})
			c := h.dialProxy(t)
			if _, err := io.WriteString(c, quietRequest(method, port, "Content-Length: 1\r\n", "x")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			resp := finalAnswer(t, bufio.NewReader(c))
			answered := time.Now()
			if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("X-Compass-Egress") != "error; reason=upstream-timeout" {
				t.Fatalf("answer %d %q, want 504 with reason upstream-timeout", resp.StatusCode, resp.Header.Get("X-Compass-Egress"))
			}
			var sent time.Time
			select {
			case sent = <-interim:
			default:
				t.Fatal("504 before the upstream sent its 102")
			}
			if took := answered.Sub(sent); took < answerIdle {
				t.Fatalf("504 %v after the 102, before the idle timeout %v", took, answerIdle)
			} else {
				t.Logf("504 %v after the 102", took.Round(time.Millisecond))
			}
			upstreamClosed(t, closed)
			idleSettled(t, h, "answer idle", "upstream")
		})
	}
}

// A swap that cuts a request waiting for its head through the Transport ends it as
// before: the client connection closes unanswered, the upstream's closes, and neither
// an "answer idle" nor an "upstream failed" line blames the upstream.
func TestSwapCutOfHeadWaitIsNotIdle(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = 10 * time.Second })
	written := make(chan struct{})
	port, closed := quietUpstream(t, h, func(net.Conn, []byte) bool { close(written); return false })
	c := h.dialProxy(t)
	if _, err := io.WriteString(c, quietRequest(http.MethodPost, port, "Content-Length: 1\r\n", "x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-written:
	case <-time.After(hangGuard):
		t.Fatalf("the request did not reach the upstream in %v", hangGuard)
	}
	if res := h.apply(`{"network_mode":"allowlist","allowed_hosts":["other.test"]}`); res.ClosedConnections != 1 {
		t.Fatalf("the swap closed %d connections, want 1", res.ClosedConnections)
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
		t.Fatalf("the client read %q (%v), want its connection closed unanswered", b, err)
	}
	upstreamClosed(t, closed)
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 && h.srv.tracker.len() == 0
	})
	for _, msg := range []string{`"msg":"answer idle"`, `"msg":"upstream failed"`} {
		if strings.Contains(h.logs.String(), msg) {
			t.Fatalf("a swap's cut logged %s:\n%s", msg, h.logs.String())
		}
	}
}

// Interim answers are bounded on both paths: at most upclient.MaxInterimAnswers of them, whose
// heads together take at most upclient.MaxAnswerHeadBytes, before the final answer; past
// either bound the client gets a 502 instead of the proxy reading them for as long as
// they come. Through net/http's Transport (the POST) only its 10 MiB head limit
// bounded them, and once the proxy counts them that limit starts afresh after each.
func TestInterimAnswersAreBounded(t *testing.T) {
	small := "HTTP/1.1 102 Processing\r\n\r\n"
	large := "HTTP/1.1 103 Early Hints\r\nLink: <" + strings.Repeat("x", upclient.MaxAnswerHeadBytes/3+1024) + ">\r\n\r\n"
	for _, tc := range []struct {
		name    string
		interim string
		count   int
		want    int
	}{
		{"five", small, upclient.MaxInterimAnswers, http.StatusOK},
		{"six", small, upclient.MaxInterimAnswers + 1, http.StatusBadGateway},
		{"three past the head bound together", large, 3, http.StatusBadGateway},
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			t.Run(method+"/"+tc.name, func(t *testing.T) {
				h := newHarness(t)
				port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
					for range tc.count {
						if _, err := io.WriteString(c, tc.interim); err != nil {
							return false
						}
					}
					_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					return err == nil
				})
				resp := askQuiet(t, h, method, port)
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Fatalf("answer %d %q, want %d", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), tc.want)
				}
			})
		}
	}
}
