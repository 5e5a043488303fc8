package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
)

// An upstream cannot speak for the proxy: its own X-Compass-Egress field (here a fake
// refusal, in the head and in the trailer) does not reach the client, on either
// forwarding path.
func TestUpstreamCannotSetTheEgressField(t *testing.T) {
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nX-Compass-Egress: denied; reason=no-network\r\n"+
				"Transfer-Encoding: chunked\r\nTrailer: X-Compass-Egress\r\n\r\n"+
				"2\r\nno\r\n0\r\nX-Compass-Egress: denied; reason=no-network\r\n\r\n")
		}
	})
	h := newHarness(t)
	h.apply(`"public"`)
	// A GET without a body goes through the proxy's own upstream client, a POST
	// through net/http's Transport.
	for method, body := range map[string]string{"GET": "", "POST": "x"} {
		t.Run(method, func(t *testing.T) {
			c := h.dialProxy(t)
			defer c.Close()
			fmt.Fprintf(c, "%s http://a.test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\nContent-Length: %d\r\n\r\n%s", method, addr.Port, addr.Port, len(body), body)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(resp.Body); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Trailer.Values("X-Compass-Egress"); len(got) != 0 {
				t.Errorf("the client got the upstream's X-Compass-Egress %q in the trailer", got)
			}
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d, want the upstream's 403", resp.StatusCode)
			}
			if got := resp.Header.Values("X-Compass-Egress"); len(got) != 0 {
				t.Errorf("the client got the upstream's X-Compass-Egress %q", got)
			}
		})
	}
}
