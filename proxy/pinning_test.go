package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// TestTunnelDoesNotPinItsRequestHead: a tunnel keeps its host for its log line, a
// substring of the CONNECT line; a path that padded the line is refused (see
// TestBypassVectors), and a padded field must not stay alive with the tunnel either.
// Each idle tunnel would then hold 60 KiB instead of the ~11 KiB docs/proxy.md
// measures.
func TestTunnelDoesNotPinItsRequestHead(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	const tunnels, pad = 100, 60 << 10
	target := fmt.Sprintf("a.test:%d", h.a.echoPort)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range tunnels {
		c := h.dialProxy(t)
		if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nX-Pad: %s\r\n\r\n", target, target, strings.Repeat("x", pad)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
			t.Fatalf("CONNECT: %q %v", buf[:n], err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > tunnels*pad/2 {
		t.Fatalf("%d idle tunnels hold %d KiB of heap (%d KiB each), want far less than their %d KiB request heads", tunnels, grew>>10, grew>>10/tunnels, pad>>10)
	}
}

// A connection whose head outgrew the 4 KiB reader goes back to one once that head is
// served: kept for the connection's keep-alive life, the 68 KiB reader let an agent pin
// 68 KiB per idle connection (some 272 MiB at --max-connections) with one long head each.
func TestIdleConnectionKeepsNoLongHeadReader(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	req := fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: a.test\r\nX-Pad: %s\r\n\r\n", h.a.httpHostPort("a.test"), strings.Repeat("p", 8<<10))
	const n = 100
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c := h.dialProxy(t)
		conns = append(conns, c)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("answer %d, close %v: want 200 on a kept connection", resp.StatusCode, resp.Close)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// 68 KiB each would be 6.8 MiB; what stays per connection is a few KiB.
	if per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n; per > 32<<10 {
		t.Fatalf("%d idle connections hold %d KiB of heap each, want under 32 KiB", n, per>>10)
	}
}
