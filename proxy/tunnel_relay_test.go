package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// TestBulkTunnelSplices: a tunnel's bulk transfer goes through the kernel (splice, whose
// pipes show in /proc/self/fd while it runs), not through a copy in user space: a
// wrapper around either connection would turn splice off and every byte-level test
// would still pass. The upstream writes and the client reads plainly, so every pipe
// that appears is the proxy's.
func TestBulkTunnelSplices(t *testing.T) {
	// Go keeps spliced pipes in a pool until two collections drop them and their
	// finalizers close them: start from a count that no longer falls.
	before := countPipes(t)
	for i := 0; i < 50; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		if now := countPipes(t); now == before {
			break
		} else {
			before = now
		}
	}
	_, tc, _ := floodingTunnel(t, time.Minute)
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), int64(countPipes(t))))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	_, err := io.CopyN(io.Discard, tc, 64<<20)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	if peak.Load() <= int64(before) {
		t.Errorf("64 MiB went through the tunnel and no pipe appeared (%d before, at most %d during): the relay did not splice", before, peak.Load())
	}
}
