package proxy

import (
	"io"
	"net"
	"net/http"
	"testing"
)

// An upstream cannot speak for the proxy: its own X-Compass-Egress field (here a fake
// refusal, in the head and in the trailer) does not reach the client, on either
// forwarding path (a GET through the proxy's own client, a POST through net/http's
// Transport).
func TestUpstreamCannotSetTheEgressField(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t)
			port, _ := quietUpstream(t, h, func(c net.Conn, _ []byte) bool {
				_, err := io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nX-Compass-Egress: denied; reason=no-network\r\n"+
					"Transfer-Encoding: chunked\r\nTrailer: X-Compass-Egress\r\n\r\n"+
					"2\r\nno\r\n0\r\nX-Compass-Egress: denied; reason=no-network\r\n\r\n")
				return err == nil
			})
			resp := askQuiet(t, h, method, port)
			if _, err := io.ReadAll(resp.Body); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d, want the upstream's 403", resp.StatusCode)
			}
			if got := resp.Header.Values("X-Compass-Egress"); len(got) != 0 {
				t.Errorf("the client got the upstream's X-Compass-Egress %q", got)
			}
			if got := resp.Trailer.Values("X-Compass-Egress"); len(got) != 0 {
				t.Errorf("the client got the upstream's X-Compass-Egress %q in the trailer", got)
			}
		})
	}
}
