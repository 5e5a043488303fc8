package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// TestSwapStopsTheConnectDialItInterrupts: a swap that refuses a CONNECT while its one
// address is being dialled stops that dial (the tunnel's cancel), so no connection to
// the destination opens once the swap has returned, even when the destination then
// answers; the client hears the 403. Without the cancel the dial runs on to its next
// SYN and connects, and only then is closed.
func TestSwapStopsTheConnectDialItInterrupts(t *testing.T) {
	h, port, fd, queued := slowDestination(t, 5*time.Second)
	c := h.dialProxy(t)
	if _, err := fmt.Fprintf(c, "CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port); err != nil {
		t.Fatal(err)
	}
	h.waitLive(t)
	time.Sleep(100 * time.Millisecond) // the dial's first SYN is dropped
	if r := h.apply(`"no-network"`); r.ClosedConnections != 1 {
		t.Fatalf("the swap closed %d connections, want 1", r.ClosedConnections)
	}
	if opened := openedAfterCut(fd, queued); opened > 0 {
		t.Fatalf("%d connection(s) opened to 127.0.0.5 after the swap returned", opened)
	}
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	if got := string(buf[:n]); !strings.HasPrefix(got, "HTTP/1.1 403") {
		t.Fatalf("the client got %q, want a 403", firstLine(got))
	}
}

// TestTunnelOutlivesTheHeaderTimeout: the 200's write deadline (--header-timeout) is
// lifted once the 200 is out; a tunnel that carries its first byte back later than
// that still delivers it.
func TestTunnelOutlivesTheHeaderTimeout(t *testing.T) {
	const headerTimeout = 200 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = headerTimeout })
	h.apply(`"public"`)
	_, c := h.connect(h.a.echoHostPort("a.test"), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	time.Sleep(2 * headerTimeout) // what is tested: the tunnel outlives the bound
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q %v", buf, err)
	}
}

// TestConnectFailureAnswerIsBounded: the 502 of a CONNECT whose dial failed is a last
// answer, bounded by --header-timeout as the 200 is: a client that reads nothing does
// not hold the worker, its slot and its tracker entry.
func TestConnectFailureAnswerIsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.5:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = 200 * time.Millisecond })
	h.apply(`"public"`)
	opened, _, writing := openToStuckClient(t, h, closed)
	<-writing
	select {
	case ok := <-opened:
		if ok {
			t.Error("a CONNECT whose dial failed reported established")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write of the 502 to a client that reads nothing still blocks after 10 s")
	}
	waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
}

// TestSwapLetsTheConfirmationOut: a swap that cuts a tunnel while its 200 is being
// written waits (up to lingerTime) for that write before it closes the client's side,
// so a client that reads meanwhile gets the 200 and then the close, not a bare EOF.
func TestSwapLetsTheConfirmationOut(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	opened, peer, writing := openToStuckClient(t, h, h.a.echoHostPort("a.test"))
	<-writing
	swapped := make(chan adminapi.ApplyResult, 1)
	go func() { swapped <- h.apply(`"no-network"`) }()
	// Well within lingerTime: the swap is then waiting on the 200 (a swap that does
	// not wait has closed the client's side by now).
	time.Sleep(httpfront.LingerTime / 5)
	_ = peer.SetReadDeadline(time.Now().Add(hangGuard))
	got, _ := io.ReadAll(peer)
	if !strings.HasPrefix(string(got), "HTTP/1.1 200 ") {
		t.Errorf("the client read %q, want the 200 and then the close", got)
	}
	if r := <-swapped; r.ClosedConnections != 1 {
		t.Errorf("the swap closed %d connections, want 1", r.ClosedConnections)
	}
	if <-opened {
		t.Error("the cut tunnel reported established")
	}
}

// TestSwapCutOfAStuckConfirmationIsBoundedByLinger: a client that reads nothing of its
// 200 holds a swap that cuts its tunnel for lingerTime, not for --header-timeout.
func TestSwapCutOfAStuckConfirmationIsBoundedByLinger(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = time.Minute })
	h.apply(`"public"`)
	opened, _, writing := openToStuckClient(t, h, h.a.echoHostPort("a.test"))
	<-writing
	swapped := make(chan adminapi.ApplyResult, 1)
	go func() { swapped <- h.apply(`"no-network"`) }()
	select {
	case r := <-swapped:
		if r.ClosedConnections != 1 {
			t.Errorf("the swap closed %d connections, want 1", r.ClosedConnections)
		}
	case <-time.After(20 * httpfront.LingerTime):
		t.Fatal("a client that reads nothing of its 200 still holds the swap after 20 lingerTimes")
	}
	if <-opened {
		t.Error("the cut tunnel reported established")
	}
}

// TestSwapClosesTheClientOfAStuckTunnel: a swap that cuts an established tunnel closes
// its client's side too, not only the upstream's. Here the client reads nothing and the
// upstream has filled every buffer, so the relay is blocked in a write to the client,
// which only closing the client's side ends: the tunnel must finish (its gauge back to
// 0) without the client reading a byte.
func TestSwapClosesTheClientOfAStuckTunnel(t *testing.T) {
	stalled := make(chan struct{})
	target := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		writeUntilStalled(c, stalled)
		<-done
	})
	h := newHarness(t)
	h.apply(`"public"`)
	_, c := h.connect(target.String(), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	select {
	case <-stalled:
	case <-time.After(hangGuard):
		t.Fatal("the upstream's writes never stalled")
	}
	if r := h.apply(`"no-network"`); r.ClosedConnections != 1 {
		t.Fatalf("the swap closed %d connections, want 1", r.ClosedConnections)
	}
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
}

// TestSwapCutsATunnelBeingSetUp: a swap that refuses a tunnel after its dial and
// before its 200 (held here where it is counted for the drain) closes the upstream side
// before it returns, and the client gets the 403 of the set in force, never a 200;
// the tunnel gives back its count (Shutdown does not wait for it) and its entry.
func TestSwapCutsATunnelBeingSetUp(t *testing.T) {
	accepted := make(chan struct{})
	upstreamEnded := make(chan struct{})
	target := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		close(accepted)
		_, _ = io.Copy(io.Discard, c) // until the proxy closes its side
		close(upstreamEnded)
	})
	h := newHarness(t)
	h.apply(`"public"`)
	h.srv.tunnelMu.Lock() // the tunnel waits in addTunnel, dialled and not confirmed
	locked := true
	defer func() {
		if locked {
			h.srv.tunnelMu.Unlock()
		}
	}()
	c := h.dialProxy(t)
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	<-accepted
	if r := h.apply(`"no-network"`); r.ClosedConnections != 1 {
		t.Fatalf("the swap closed %d connections, want 1", r.ClosedConnections)
	}
	select {
	case <-upstreamEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream side of a tunnel the swap cut is still open after it returned")
	}
	h.srv.tunnelMu.Unlock()
	locked = false
	got, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 403 ") {
		t.Fatalf("the client got %q, want a 403", firstLine(string(got)))
	}
	waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- h.srv.Shutdown(ctx) }()
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("shutdown waits for the cut tunnel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown still waits for the cut tunnel after 10 s")
	}
}

// TestTunnelForwardsOneEarlyByte: bytes sent along with the CONNECT are forwarded
// first, down to a single one (the front copies what it buffered, the relay writes it
// before it reads the client), and counted, as the bytes back are, once the tunnel
// closes.
func TestTunnelForwardsOneEarlyByte(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	up, down := h.srv.metrics.bytes.WithLabelValues("upstream"), h.srv.metrics.bytes.WithLabelValues("downstream")
	upBefore, downBefore := testutil.ToFloat64(up), testutil.ToFloat64(down)
	_, c := h.connect(h.a.echoHostPort("a.test"), "x")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil || string(out) != "x|eof after 1" {
		t.Fatalf("upstream echoed %q %v", out, err)
	}
	c.Close()
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
	if u, d := testutil.ToFloat64(up)-upBefore, testutil.ToFloat64(down)-downBefore; u != 1 || d != float64(len(out)) {
		t.Errorf("counted %v bytes up and %v down, want 1 and %d", u, d, len(out))
	}
}

// TestDialFailureDuringTheDrainIs502: a CONNECT whose dial fails on its own (its
// timeout) while a drain waits for it is the upstream's failure, a 502 dial-failed,
// not the drain's 503: only the drain's deadline makes a failed dial the drain's.
func TestDialFailureDuringTheDrainIs502(t *testing.T) {
	h, port, _, _ := slowDestination(t, 300*time.Millisecond)
	c := h.dialProxy(t)
	fmt.Fprintf(c, "CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port)
	h.waitLive(t)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- h.srv.Shutdown(ctx) }()
	got, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 502 ") || !strings.Contains(string(got), "reason=dial-failed") {
		t.Errorf("the client got %q, want a 502 dial-failed", got)
	}
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestTunnelFinishedWhenItsLastDirectionPanics: a panic in the end of the direction
// that ends last (here its close of the client's side) still finishes the tunnel once:
// its drain count, gauge, connection slot and tracker entry are given back.
func TestTunnelFinishedWhenItsLastDirectionPanics(t *testing.T) {
	h := newHarness(t)
	gauge := testutil.ToFloat64(h.srv.metrics.activeConnect)
	tun, clientPeer, _ := handedTunnel(t, h, func(client net.Conn) net.Conn { return &closePanicConn{Conn: client} })
	go h.srv.runTunnel(tun)
	// The client's EOF ends the upward direction first, which closes both pipes; the
	// downward one then ends last and panics in its close of the client's side.
	clientPeer.Close()
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), "test: close panics") })
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeConnect) == gauge && h.srv.tracker.len() == 0
	})
	if n := h.srv.proxyLn.Held(); n != 0 {
		t.Errorf("%d connection slot(s) still held", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Errorf("shutdown waits for the tunnel: %v", err)
	}
}

// TestFinishedTunnelStopsItsIdleWatch: a tunnel that ends stops its idle watch, whose
// timer would otherwise hold the tunnel (its sockets and buffers) for up to a whole
// --tunnel-idle-timeout after it closed.
func TestFinishedTunnelStopsItsIdleWatch(t *testing.T) {
	h := newHarness(t)
	tun, clientPeer, upPeer := handedTunnel(t, h, nil)
	finished := make(chan struct{})
	go func() { defer close(finished); h.srv.relayDirection(tun, &tun.downward, &tun.downEnded) }()
	go h.srv.relayDirection(tun, &tun.upward, &tun.upEnded)
	clientPeer.Close()
	upPeer.Close()
	select {
	case <-finished:
	case <-time.After(hangGuard):
		t.Fatal("the tunnel did not end")
	}
	waitFor(t, func() bool { return tun.ended.Load() == 2 && h.srv.tracker.len() == 0 })
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
	if !tun.idle.Stopped() {
		t.Error("the finished tunnel's idle watch still runs")
	}
}

// TestConnectDialledDuringTheDrainIsRefused: a CONNECT whose dial completes after the
// drain has begun is not confirmed: the drain no longer counts new tunnels, so the
// client hears 503 draining, never a 200 for a tunnel the drain would not wait for.
func TestConnectDialledDuringTheDrainIsRefused(t *testing.T) {
	h, port, fd, queued := slowDestination(t, 10*time.Second)
	c := h.dialProxy(t)
	fmt.Fprintf(c, "CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port)
	h.waitLive(t)
	time.Sleep(100 * time.Millisecond) // the dial's first SYN is dropped
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- h.srv.Shutdown(ctx) }()
	waitFor(t, func() bool { return h.srv.draining.Load() })
	// Room in the accept queue: the dial gets through on its next SYN.
	for range queued {
		nfd, _, err := syscall.Accept(fd)
		for err != nil {
			time.Sleep(10 * time.Millisecond)
			nfd, _, err = syscall.Accept(fd)
		}
		syscall.Close(nfd)
	}
	got, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 503 ") || !strings.Contains(string(got), "reason=draining") {
		t.Errorf("the client got %q, want a 503 draining", firstLine(string(got)))
	}
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestConnectWithUserinfoIsRefusedAsSuch: "CONNECT user@host:port" is refused with
// its own reason, which says what the client did, not as an invalid host.
func TestConnectWithUserinfoIsRefusedAsSuch(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	target := h.a.echoHostPort("a.test")
	got := h.raw(fmt.Sprintf("CONNECT u@%s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target))
	if !strings.HasPrefix(got, "HTTP/1.1 403 ") || !strings.Contains(got, "reason="+ReasonUserinfo) {
		t.Fatalf("the client got %q, want a 403 with reason %s", got, ReasonUserinfo)
	}
}

// handedTunnel builds over pipes, and starts the clocks of, a tunnel as openTunnel
// hands it to the relay, having taken what openTunnel takes (a connection slot, a drain
// count, a tracker entry, the gauge); wrapDown, if not nil, wraps the client side the
// downward direction writes to. It returns the far ends of the client and upstream
// pipes, closed at the test's end.
func handedTunnel(t *testing.T, h *harness, wrapDown func(net.Conn) net.Conn) (tun *tunnel, clientPeer, upPeer net.Conn) {
	t.Helper()
	clientPeer, client := net.Pipe()
	t.Cleanup(func() { clientPeer.Close() })
	upPeer, up := net.Pipe()
	t.Cleanup(func() { upPeer.Close() })
	downDst := client
	if wrapDown != nil {
		downDst = wrapDown(client)
	}
	return startHandedTunnel(t, h, up, client, downDst, nil), clientPeer, upPeer
}

// startHandedTunnel starts a tunnel between up and client, the downward direction
// writing to downDst, with pre as the client's early bytes, having taken what
// openTunnel takes (a connection slot, a drain count, a tracker entry, the gauge).
func startHandedTunnel(t *testing.T, h *harness, up, client, downDst net.Conn, pre []byte) *tunnel {
	t.Helper()
	h.srv.proxyLn.Hold()
	if !h.srv.addTunnel() {
		t.Fatal("draining")
	}
	entry := &liveConn{typ: typeConnect, name: "a.test", port: 1}
	h.srv.tracker.add(entry)
	tun := &tunnel{upward: connio.NewDirection(up, client, pre), downward: connio.NewDirection(downDst, up, nil),
		entry: entry, clientAddr: "127.0.0.1:40000"}
	h.srv.startTunnel(tun)
	h.srv.metrics.activeConnect.Inc()
	return tun
}

// writeUntilStalled writes to c until a write has waited 200 ms, then closes stalled:
// the proxy reads no more from c, so its own write to its client blocks.
func writeUntilStalled(c net.Conn, stalled chan struct{}) {
	chunk := make([]byte, 64<<10)
	for {
		_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Write(chunk); err != nil {
			break
		}
	}
	close(stalled)
}
