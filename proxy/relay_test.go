package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTunnelBulkThenSmall: a tunnel that moves from read/write to splice in the middle
// of a transfer (a read filled the buffer) loses and reorders nothing, and still passes
// the half-close on.
func TestTunnelBulkThenSmall(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	_, c := h.connect(h.a.echoHostPort("a.test"), "early-")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	payload := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			_, err = io.WriteString(c, "late")
		}
		if err == nil {
			err = c.Conn.(*net.TCPConn).CloseWrite()
		}
		sent <- err
	}()
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	want := "early-" + string(payload) + "late" + fmt.Sprintf("|eof after %d", len(payload)+10)
	if string(out) != want {
		t.Fatalf("echo of %d bytes came back as %d bytes (prefix %q, suffix %q)", len(want), len(out), out[:min(len(out), 16)], out[max(0, len(out)-24):])
	}
}

// TestIdleTunnelsHoldNoPipes: tunnels that exchanged a few bytes and wait hold their
// two sockets only; splice would hold a pipe pair per waiting direction.
func TestIdleTunnelsHoldNoPipes(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	// An echo server of plain reads and writes: the harness's splices, and its pipes
	// would be counted too.
	echo := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	})
	before := countPipes(t)
	const tunnels = 20
	for range tunnels {
		_, c := h.connect(echo.String(), "")
		if c == nil {
			t.Fatal("CONNECT refused")
		}
		echoRoundTrip(t, c, "ping")
	}
	if grown := countPipes(t) - before; grown >= tunnels {
		t.Fatalf("%d idle tunnels opened %d pipe descriptors", tunnels, grown)
	}
}

func countPipes(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, "pipe:") {
			n++
		}
	}
	return n
}
