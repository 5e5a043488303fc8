package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// headFieldLines is n small field lines.
func headFieldLines(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-F%d: v\r\n", i)
	}
	return b.String()
}

// An answer head is bounded in bytes and in fields on both paths. Parsed, a head of
// tiny fields costs the proxy about thirty times its size, held until the answer's body
// begins: under the former 10 MiB bound one answer of 9 MiB held 280 to 400 MiB of
// heap, so an upstream the agent runs behind any allowed name could exhaust the host's
// memory (the sidecar has no memory limit) with a few connections.
func TestAnswerHeadIsBoundedInBytesAndFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		head string
		want int
	}{
		{"a hundred fields", headFieldLines(100), http.StatusOK},
		{"128 KiB in one field", "X-Long: " + strings.Repeat("y", 128<<10) + "\r\n", http.StatusBadGateway},
		{"a thousand small fields", headFieldLines(1000), http.StatusBadGateway},
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			t.Run(method+"/"+tc.name, func(t *testing.T) {
				h := newHarness(t)
				port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
					_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n"+tc.head+"Content-Length: 2\r\n\r\nok")
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

// A request head is bounded in fields as well as in bytes: 68 KiB of tiny fields held
// about 1 MiB of heap per connection while the request was served.
func TestRequestHeadIsBoundedInFields(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	for _, tc := range []struct {
		fields int
		want   string
	}{
		{100, "HTTP/1.1 200 "},
		{1000, "HTTP/1.1 431 "},
	} {
		out := h.raw(fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n%s\r\n", h.a.httpHostPort("a.test"), headFieldLines(tc.fields)))
		if !strings.HasPrefix(out, tc.want) {
			t.Errorf("%d fields: answer %.80q, want %q", tc.fields, out, tc.want)
		}
	}
}

// The "upstream failed" line quotes the error, and net/http's parser quotes a malformed
// status line whole: an upstream the agent runs made every request it answered so write
// a WARN line of up to four times the head bound (each byte quoted as \xNN).
func TestUpstreamFailureLineIsBounded(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t)
			port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
				_, _ = io.WriteString(c, "HTTP/1.1"+strings.Repeat("\x01", 40<<10)+"\r\n\r\n")
				return false
			})
			resp := askQuiet(t, h, method, port)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("answer %d, want 502", resp.StatusCode)
			}
			var line string
			waitFor(t, func() bool {
				for _, l := range strings.Split(h.logs.String(), "\n") {
					if strings.Contains(l, `"msg":"upstream failed"`) {
						line = l
						return true
					}
				}
				return false
			})
			if len(line) > 2<<10 {
				t.Fatalf("the upstream-failed line has %d bytes: %.200s...", len(line), line)
			}
		})
	}
}
