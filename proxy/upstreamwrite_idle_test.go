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
)

// An upstream that reads a request's head and then takes none of its body: the
// Transport's write of the body blocks, and its wait for the answer head starts only
// once the body is written, so before idleWriter bounded the Transport's connections
// the request held its goroutine, slot and both connections for ever. Now the write
// fails once nothing moved for the tunnel idle timeout: the client gets a 504
// upstream-timeout, the upstream connection closes, one WARN line names the side.
func TestRequestBodyTheUpstreamStopsTakingEnds(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
	h.dns.set("quiet.test", netip.MustParseAddr("127.0.0.23"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["quiet.test"]}`)
	answered, closed := make(chan struct{}), make(chan struct{})
	port := serveTCP(t, "127.0.0.23", func(c net.Conn, done <-chan struct{}) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		// Reads nothing more until the client has its answer, then reads to the end
		// the proxy must have made.
		select {
		case <-answered:
		case <-done:
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err == nil {
			close(closed)
		}
	}).Port
	c := h.dialProxy(t)
	const size = 256 << 20 // far more than the socket buffers on the way hold
	go func() {
		_, _ = fmt.Fprintf(c, "POST http://quiet.test:%d/ HTTP/1.1\r\nHost: quiet.test:%d\r\nContent-Length: %d\r\n\r\n", port, port, size)
		_, _ = io.CopyN(c, zeroReader{}, size)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	close(answered)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("X-Compass-Egress") != "error; reason=upstream-timeout" ||
		!strings.Contains(string(body), "took none of the request") {
		t.Fatalf("answer %d %q %q, want a 504 upstream-timeout", resp.StatusCode, resp.Header.Get("X-Compass-Egress"), body)
	}
	idleSettled(t, h, "request body idle", "upstream")
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream connection was not closed")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
