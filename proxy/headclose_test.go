package proxy

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// TestUpstreamGoneAfterItsHead: an upstream that sends an answer's head and closes
// before any of its body has sent the client nothing yet (the head waits for the
// body's first bytes), so the client gets a 502 that says whose failure it was, not a
// bare close, over both upstream clients (without and with a request body).
func TestUpstreamGoneAfterItsHead(t *testing.T) {
	h := newHarness(t)
	h.dns.set("hc.test", netip.MustParseAddr("127.0.0.21"))
	h.apply(`"public"`)
	port := serveTCP(t, "127.0.0.21", func(c net.Conn, _ <-chan struct{}) {
		_, _ = c.Read(make([]byte, 4096))
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
	}).Port
	for _, tc := range []struct{ name, rest string }{
		{"GET", "\r\n"},
		{"POST", "Content-Length: 2\r\n\r\nhi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := h.raw(fmt.Sprintf("%s http://hc.test:%d/ HTTP/1.1\r\nHost: hc.test:%d\r\n%s", tc.name, port, port, tc.rest))
			if !strings.HasPrefix(out, "HTTP/1.1 502 ") || !strings.Contains(out, "X-Compass-Egress: error; reason=upstream-failed\r\n") {
				t.Errorf("answer %q, want a 502 upstream-failed", out)
			}
		})
	}
}
