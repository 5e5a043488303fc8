package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// startSink serves one-way traffic on 127.0.0.2: it reads until a line "end", then
// answers how many bytes came before it.
func startSink(t *testing.T) string {
	t.Helper()
	return serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		r := bufio.NewReader(c)
		n := 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if line == "end\n" {
				fmt.Fprintf(c, "got %d\n", n)
				return
			}
			n += len(line)
		}
	}).String()
}

// TestTunnelIdleTimeout: a tunnel with no byte either way is closed after the idle
// timeout; one with traffic in one direction only lives on, however long the other
// stays quiet.
func TestTunnelIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)

	t.Run("idle", func(t *testing.T) {
		_, tc := h.connect(h.a.echoHostPort("127.0.0.2"), "")
		if tc == nil {
			t.Fatal("CONNECT refused")
		}
		echoRoundTrip(t, tc, "ping")
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := tc.Read(make([]byte, 1))
		if !errors.Is(err, io.EOF) {
			t.Fatalf("idle tunnel: read %v, want EOF (closed by the proxy)", err)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		br := h.websocket(t, "127.0.0.2", 10*time.Second)
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("idle websocket: read %v, want EOF (closed by the proxy)", err)
		}
	})

	t.Run("one-way", func(t *testing.T) {
		_, tc := h.connect(startSink(t), "")
		if tc == nil {
			t.Fatal("CONNECT refused")
		}
		sent := 0
		for end := time.Now().Add(4 * idle); time.Now().Before(end); {
			n, err := io.WriteString(tc, "x\n")
			if err != nil {
				t.Fatalf("write after %d bytes: %v", sent, err)
			}
			sent += n
			time.Sleep(idle / 6)
		}
		if _, err := io.WriteString(tc, "end\n"); err != nil {
			t.Fatal(err)
		}
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(tc).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != fmt.Sprintf("got %d", sent) {
			t.Fatalf("one-way tunnel: %q %v, want got %d", line, err, sent)
		}
	})
}
