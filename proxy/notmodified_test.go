package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
)

// TestNotModifiedKeepsItsLength: a 304's Content-Length is the length of the
// representation a 200 would have carried (RFC 9110, 8.6), never of its empty body; a
// cache that took a made-up "0" for it would shorten what it stores. The client gets
// the upstream's field, or none, over both upstream clients (without and with a body).
func TestNotModifiedKeepsItsLength(t *testing.T) {
	h := newHarness(t)
	h.dns.set("nm.test", netip.MustParseAddr("127.0.0.21"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["nm.test"]}`)
	// net/http's server drops a 304's Content-Length: this upstream answers as written.
	port := serveRawHTTP(t, "127.0.0.21", func(c net.Conn, req *http.Request) bool {
		_, _ = io.Copy(io.Discard, req.Body)
		length := ""
		if req.URL.Path == "/length" {
			length = "Content-Length: 5\r\n"
		}
		_, err := io.WriteString(c, "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n"+length+"\r\n")
		return err == nil
	}).Port
	host := fmt.Sprintf("nm.test:%d", port)
	for _, tc := range []struct {
		name, req, length string
	}{
		{"GET", "GET http://%[1]s/ HTTP/1.1\r\nHost: %[1]s\r\n\r\n", ""},
		{"PUT", "PUT http://%[1]s/ HTTP/1.1\r\nHost: %[1]s\r\nContent-Length: 2\r\n\r\nhi", ""},
		{"GET with a length", "GET http://%[1]s/length HTTP/1.1\r\nHost: %[1]s\r\n\r\n", "5"},
		{"PUT with a length", "PUT http://%[1]s/length HTTP/1.1\r\nHost: %[1]s\r\nContent-Length: 2\r\n\r\nhi", "5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.dialProxy(t)
			br := bufio.NewReader(c)
			for i := range 2 { // the connection stays in step for the next request
				fmt.Fprintf(c, tc.req, host)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotModified {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				if got := resp.Header.Get("Content-Length"); got != tc.length {
					t.Errorf("request %d: Content-Length %q, want %q", i, got, tc.length)
				}
			}
		})
	}
}
