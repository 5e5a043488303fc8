package proxy

import (
	"bufio"
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

// An upstream that ends its connection while the client is still sending the request
// body. net/http's Transport returns the error only once its writer of the body does,
// and that writer waits in a read of the client's body: before the front stopped that
// read, the client got no answer until it sent the rest of its body or until the
// tunnel idle timeout cut it (a minute here, 15 by default). Now it gets a 502 at once,
// and the proxy gives back what the request held. An upstream that answers before it
// leaves still has its answer relayed.
func TestUpstreamGoneMidBodyAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reset  bool   // the upstream resets rather than closes
		framed string // the request's framing field
		answer string // what the upstream writes before it leaves
		status int    // the answer the client must get
		reason string // its X-Compass-Egress field
	}{
		{"close, Content-Length", false, "Content-Length: 100", "", 502, "error; reason=upstream-failed"},
		{"reset, Content-Length", true, "Content-Length: 100", "", 502, "error; reason=upstream-failed"},
		{"close, chunked", false, "Transfer-Encoding: chunked", "", 502, "error; reason=upstream-failed"},
		{"early answer, then close", false, "Content-Length: 100",
			"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 413, ""},
		{"early close-delimited answer", false, "Content-Length: 100",
			"HTTP/1.1 403 Forbidden\r\nConnection: close\r\n\r\nno", 403, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = time.Minute })
			h.dns.set("gone.test", netip.MustParseAddr("127.0.0.24"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["gone.test"]}`)
			port := serveTCP(t, "127.0.0.24", func(c net.Conn, _ <-chan struct{}) {
				// The head and the body's first bytes: the Transport then waits in a
				// read of the client's body, not in a write that could meet the close
				// (and end the wait without the front's doing).
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				if _, err := io.ReadFull(req.Body, make([]byte, 2)); err != nil {
					return
				}
				_, _ = io.WriteString(c, tc.answer)
				if tc.reset {
					_ = c.(*net.TCPConn).SetLinger(0)
				}
			}).Port
			c := h.dialProxy(t)
			first := "ab"
			if tc.framed == "Transfer-Encoding: chunked" {
				first = "2\r\nab\r\n"
			}
			if _, err := fmt.Fprintf(c, "POST http://gone.test:%d/ HTTP/1.1\r\nHost: gone.test:%d\r\n%s\r\n\r\n%s", port, port, tc.framed, first); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer while the client holds the rest of its body: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || resp.Header.Get("X-Compass-Egress") != tc.reason {
				t.Fatalf("answer %d %q %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body, tc.status, tc.reason)
			}
			waitFor(t, func() bool {
				return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 && h.srv.tracker.len() == 0
			})
			if blamed := strings.Contains(h.logs.String(), `"msg":"upstream failed"`); blamed != (tc.status == http.StatusBadGateway) {
				t.Errorf("a WARN line blaming the upstream: %v, want %v, in %s", blamed, !blamed, h.logs.String())
			}
		})
	}
}
