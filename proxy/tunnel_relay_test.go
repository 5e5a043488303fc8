package proxy

import (
	"bytes"
	"errors"
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

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/proxy/connio"
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

// TestTunnelEndsWhenItsUpstreamResets: an upstream that resets its connection (here
// right after the tunnel is up, with the client idle) ends the tunnel at once: the
// direction whose read failed closes both sides, so the client's side closes and the
// tunnel gives back its gauge and tracker entry without the client sending anything.
// Half-closing the client instead (as on a clean EOF), or closing the upstream side
// alone, leaves the tunnel, its sockets and its slot to the idle timeout.
func TestTunnelEndsWhenItsUpstreamResets(t *testing.T) {
	target, reset := resetOnCue(t, false)
	h := newHarness(t)
	h.apply(`"public"`)
	_, c := h.connect(target.String(), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	close(reset)
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 && h.srv.tracker.len() == 0
	})
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if n, err := c.Read(make([]byte, 1)); n != 0 || errors.Is(err, errTimeout(err)) {
		t.Errorf("the client's side of a tunnel whose upstream reset: read %d, %v; want it closed", n, err)
	}
}

// TestTunnelEndsWhenAWriteUpstreamFails: once the upstream has half-closed (its EOF
// reached the client) and then reset, what the client still sends cannot be
// delivered: the failed write ends the tunnel, instead of the relay reading and
// dropping the client's bytes for as long as it sends them.
func TestTunnelEndsWhenAWriteUpstreamFails(t *testing.T) {
	target, reset := resetOnCue(t, true)
	h := newHarness(t)
	h.apply(`"public"`)
	_, c := h.connect(target.String(), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
		t.Fatalf("the upstream's half-close reached the client as %q, %v; want EOF", rest, err)
	}
	close(reset)
	// Each write may be the first to meet the reset; the ones after the tunnel ended
	// fail at the client, which is fine.
	waitFor(t, func() bool {
		_, _ = io.WriteString(c, "x")
		return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 && h.srv.tracker.len() == 0
	})
}

// resetOnCue serves a target on 127.0.0.2 that, on each connection, half-closes first
// if halfClose, and resets the connection once reset is closed.
func resetOnCue(t *testing.T, halfClose bool) (target *net.TCPAddr, reset chan struct{}) {
	reset = make(chan struct{})
	target = serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		if halfClose {
			_ = c.(*net.TCPConn).CloseWrite()
		}
		select {
		case <-reset:
		case <-done:
			return
		}
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	return target, reset
}

// TestFinishedTunnelReleasesItsSockets: a tunnel between two TCP sockets (as
// openTunnel hands it over) that ends by a clean half-close each way, where neither
// direction's end closes a socket, closes both of its sockets when it finishes, and
// stops its watch's timer (which also turns on the upstream's keep-alive): nothing of
// it (two descriptors, a timer that would fire on a closed socket and hold the tunnel
// until then) outlives it.
func TestFinishedTunnelReleasesItsSockets(t *testing.T) {
	h := newHarness(t)
	gauge := testutil.ToFloat64(h.srv.metrics.activeConnect)
	client, clientPeer := tcpPair(t)
	up, upPeer := tcpPair(t)
	tun := startHandedTunnel(t, h, up, client, client, nil)
	go h.srv.runTunnel(tun)
	for _, peer := range []*net.TCPConn{clientPeer, upPeer} {
		if _, err := io.WriteString(peer, "hi"); err != nil {
			t.Fatal(err)
		}
		if err := peer.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	for name, peer := range map[string]*net.TCPConn{"client": clientPeer, "upstream": upPeer} {
		_ = peer.SetReadDeadline(time.Now().Add(hangGuard))
		if got, err := io.ReadAll(peer); err != nil || string(got) != "hi" {
			t.Fatalf("the %s read %q, %v; want the other side's bytes and EOF", name, got, err)
		}
	}
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeConnect) == gauge && h.srv.tracker.len() == 0
	})
	for name, c := range map[string]*net.TCPConn{"client": client, "upstream": up} {
		if err := c.SetReadDeadline(time.Time{}); !errors.Is(err, net.ErrClosed) {
			t.Errorf("the tunnel's %s socket after it finished: %v, want it closed", name, err)
		}
	}
	if !tun.idle.Stopped() { // which releases its timer (connio's tests)
		t.Error("the finished tunnel's watch was not stopped")
	}
}

// TestTunnelUpstreamKeepAliveSettings: the keep-alive a tunnel's upstream socket gets
// once the tunnel has lived tunnelKeepAliveAfter is the proxy's own (probes after 15 s
// idle, every 15 s, 9 of them), not merely switched on: the kernel's default would
// send the first probe after two hours, long after a NAT on the way has dropped the
// flow. A tunnel idle from its start sends its first probe within the 4 minutes of the
// least patient cloud NAT.
func TestTunnelUpstreamKeepAliveSettings(t *testing.T) {
	if first := tunnelKeepAliveAfter + connio.UpstreamKeepAlive.Idle; first >= 4*time.Minute {
		t.Errorf("an idle tunnel's first keep-alive probe goes out %v after it opened, want within 4m", first)
	}
	h := newHarness(t)
	client, _ := tcpPair(t)
	up, _ := tcpPair(t)
	saved := tunnelKeepAliveAfter
	tunnelKeepAliveAfter = time.Millisecond // read here, by startTunnel
	tun := &tunnel{upward: connio.NewDirection(up, client, nil), downward: connio.NewDirection(client, up, nil), clientAddr: "127.0.0.1:40000"}
	if tcpSockopt(t, up, unix.SOL_SOCKET, unix.SO_KEEPALIVE) != 0 {
		t.Fatal("the upstream socket has keep-alive before the tunnel starts")
	}
	h.srv.startTunnel(tun) // no relay runs: nothing but the watch's timer touches the sockets
	tunnelKeepAliveAfter = saved
	defer tun.idle.Stop()
	want := [][3]int{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9},
	}
	waitFor(t, func() bool {
		for _, o := range want {
			if tcpSockopt(t, up, o[0], o[1]) != o[2] {
				return false
			}
		}
		return true
	})
}

// writeReporter is an upstream socket that reports each write's error once the write has
// returned. It is no *net.TCPConn, so the relay copies through it in user space.
type writeReporter struct {
	*net.TCPConn
	written chan error
}

func (c *writeReporter) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	select {
	case c.written <- err:
	default: // a later write: only the first is waited for
	}
	return n, err
}

// TestTunnelEndsWhenItsEarlyBytesCannotBeSent: early bytes whose write upstream fails
// (the upstream reset the connection before they went out) end the tunnel, as any
// failed write does, instead of the relay going on to read the client for a tunnel
// whose upstream is gone. The downward direction starts only once the write has
// failed, which took the reset's error: it then reads a plain EOF, and the tunnel would
// stay open, half-closed, until the client sends again or the idle timeout.
func TestTunnelEndsWhenItsEarlyBytesCannotBeSent(t *testing.T) {
	h := newHarness(t)
	gauge := testutil.ToFloat64(h.srv.metrics.activeConnect)
	client, clientPeer := tcpPair(t)
	upSock, upPeer := tcpPair(t)
	_ = upPeer.SetLinger(0)
	upPeer.Close() // a reset, which has arrived once the socket is closed
	waitFor(t, func() bool {
		rc, err := upSock.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var state uint8
		_ = rc.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				state = info.State
			}
		})
		return state == 7 // TCP_CLOSE
	})
	up := &writeReporter{TCPConn: upSock, written: make(chan error, 1)}
	tun := startHandedTunnel(t, h, up, client, client, []byte("early"))
	go h.srv.relayDirection(tun, &tun.upward, &tun.upEnded)
	select {
	case err := <-up.written:
		if err == nil {
			t.Fatal("the early bytes were written to a reset connection")
		}
	case <-time.After(hangGuard):
		t.Fatal("the early bytes were never written")
	}
	go h.srv.relayDirection(tun, &tun.downward, &tun.downEnded)
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeConnect) == gauge && h.srv.tracker.len() == 0
	})
	_ = clientPeer.SetReadDeadline(time.Now().Add(hangGuard))
	if n, err := clientPeer.Read(make([]byte, 1)); n != 0 || errors.Is(err, errTimeout(err)) {
		t.Errorf("the client's side: read %d, %v; want it closed", n, err)
	}
}
