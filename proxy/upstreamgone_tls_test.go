package proxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/internal/testutil"
)

// The same as TestUpstreamGoneMidBodyAnswers for an https:// URI, whose connection the
// Transport reads through its TLS client. An upstream that closes its TLS connection
// the ordinary way sends close_notify before its FIN: the TLS client then reports the
// end itself and never reads the FIN from the connection beneath it, so no read of
// upstreamConn fails.
func TestUpstreamGoneMidBodyAnswersOverTLS(t *testing.T) {
	cert := testutil.SelfSigned(t, "gone.test")
	for _, tc := range []struct {
		name        string
		closeNotify bool // the upstream ends its TLS session (close_notify) before the TCP close
	}{
		{"close_notify, then close", true},
		{"close without close_notify", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = time.Minute })
			h.dns.set("gone.test", netip.MustParseAddr("127.0.0.24"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["gone.test"]}`)
			roots := x509.NewCertPool()
			roots.AddCert(cert.Leaf)
			h.srv.current.Load().transport.TLSClientConfig = &tls.Config{RootCAs: roots}
			port := serveTCP(t, "127.0.0.24", func(c net.Conn, _ <-chan struct{}) {
				tc2 := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
				// The head and the body's first bytes: the Transport then waits in a
				// read of the client's body, not in a write that could meet the close.
				req, err := http.ReadRequest(bufio.NewReader(tc2))
				if err != nil {
					return
				}
				if _, err := io.ReadFull(req.Body, make([]byte, 2)); err != nil {
					return
				}
				if tc.closeNotify {
					_ = tc2.Close()
				}
			}).Port
			c := h.dialProxy(t)
			if _, err := fmt.Fprintf(c, "POST https://gone.test:%d/ HTTP/1.1\r\nHost: gone.test:%d\r\nContent-Length: 100\r\n\r\nab", port, port); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer while the client holds the rest of its body: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Compass-Egress") != "error; reason=upstream-failed" {
				t.Fatalf("answer %d %q, want 502 upstream-failed", resp.StatusCode, resp.Header.Get("X-Compass-Egress"))
			}
		})
	}
}
