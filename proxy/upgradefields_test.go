package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestUpgradeFieldsOnAPlainAnswer: an answer other than a 101 that carries
// "Connection: Upgrade" and "Upgrade: websocket" (a 426 Upgrade Required must name
// the protocol, RFC 9110 15.5.22) is an ordinary answer: its head and body reach the
// client whole. goproxy takes any answer with those fields for a websocket handshake
// and hijacks the connection, which cut the answer after its head.
func TestUpgradeFieldsOnAPlainAnswer(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	for _, tc := range []struct {
		name, status string
		body         bool // the request has a body: net/http's Transport, not the upstream client
	}{
		{"426 upstream client", "426 Upgrade Required", false},
		{"426 transport", "426 Upgrade Required", true},
		{"200 upstream client", "200 OK", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				fmt.Fprintf(c, "HTTP/1.1 %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 5\r\n\r\nnope\n", tc.status)
			})
			req := fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr, addr)
			if tc.body {
				req = fmt.Sprintf("POST http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi", addr, addr)
			}
			out := h.raw(req)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(out)), nil)
			if err != nil {
				t.Fatalf("answer %q: %v", out, err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != "nope\n" || !strings.HasPrefix(out, "HTTP/1.1 "+tc.status) {
				t.Fatalf("answer %q: body %q, %v; want %s with its body", out, body, err, tc.status)
			}
		})
	}
}
