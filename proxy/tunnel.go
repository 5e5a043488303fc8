package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// decideTunnel decides and records a CONNECT target under rs.
func (s *Server) decideTunnel(ctx context.Context, rs *RuleSet, target, client string) Verdict {
	v := Verdict{Host: target}
	if h, port, reason := splitAuthority(target, 0); reason != "" {
		v.Reason = reason
	} else {
		v = s.decide(ctx, rs, h, port)
	}
	s.record(rs, typeConnect, v, client)
	return v
}

// openTunnel dials the checked address and relays bytes. Both sides stay *net.TCPConn
// so ReadFrom splices in the kernel; each direction half-closes on EOF; bytes the client
// sent along with the CONNECT (buffered) are forwarded first. It reports whether the
// tunnel started; if it did not, it has answered the client and the caller closes the
// connection.
func (s *Server) openTunnel(r *http.Request, client net.Conn, buffered []byte, rs *RuleSet, v Verdict) bool {
	// The answers that end a CONNECT unserved are bounded as the front's last answers are.
	fail := func(status, reason string) {
		_ = client.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
		_, _ = io.WriteString(client, errorAnswer(status, reason))
	}
	up, addr, err := s.dialVerdict(r.Context(), &v, false)
	if err != nil {
		s.log.Warn("dial failed", "type", typeConnect, "host", blockedHost(v), "port", v.Port, "client", r.RemoteAddr, "error", err.Error())
		fail("502 Bad Gateway", "dial-failed")
		return false
	}
	// A swap that cuts the tunnel while it is set up closes the upstream side and leaves
	// the client a clean answer rather than a bare EOF: a 403 if the 200 is not on its
	// way yet, else the 200 and then the close. The 200 is written without the lock, so
	// that a client that reads nothing cannot hold the swap; a cut bounds that write
	// instead. Once the tunnel is established, a cut closes both sides.
	const (
		settingUp = iota
		confirming
		established
	)
	var (
		mu    sync.Mutex
		state = settingUp
		cut   bool
	)
	entry := &liveConn{typ: typeConnect, name: v.Name, addr: addr, port: v.Port}
	entry.close = func() {
		mu.Lock()
		defer mu.Unlock()
		up.Close()
		switch state {
		case confirming:
			_ = client.SetWriteDeadline(time.Now().Add(lingerTime))
		case established:
			client.Close()
		}
		cut = true
	}
	s.tracker.add(entry)
	refuse := func() {
		s.tracker.remove(entry)
		up.Close()
		cur := s.current.Load()
		v = s.redecide(cur, v)
		if v.Allowed { // cut by a swap that has since been swapped back
			v.Allowed, v.Reason = false, ReasonPolicyChanged
		}
		s.record(cur, typeConnect, v, r.RemoteAddr)
		_ = client.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
		_ = refusalResponse(r, cur, typeConnect, v).Write(client)
	}
	if cur := s.current.Load(); cur != rs && !s.decider.Recheck(cur, v.Name, addr, v.Port) {
		refuse()
		return false
	}
	// Counted for the drain before the client hears 200: a drain that starts now waits
	// for this tunnel instead of cutting one it just confirmed.
	if !s.addTunnel() {
		s.tracker.remove(entry)
		up.Close()
		fail("503 Service Unavailable", "draining")
		return false
	}
	mu.Lock()
	if cut {
		mu.Unlock()
		s.tunnels.Done()
		refuse()
		return false
	}
	state = confirming
	mu.Unlock()
	_, err = io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n")
	mu.Lock()
	state = established
	cutWhileConfirming := cut
	mu.Unlock()
	if err != nil || cutWhileConfirming {
		s.tracker.remove(entry)
		up.Close()
		s.tunnels.Done()
		return false
	}
	s.metrics.activeConnect.Inc()
	// The goroutine keeps only what it logs: not the request, whose memory would
	// otherwise live as long as the tunnel.
	t := &tunnelDone{entry: entry, host: blockedHost(v), port: v.Port, addr: addr, client: r.RemoteAddr,
		gen: rs.Generation, task: rs.Task, phase: rs.Phase}
	go s.runTunnel(client, up, buffered, t)
	return true
}

// tunnelDone is what a finished tunnel reports.
type tunnelDone struct {
	entry              *liveConn
	host               string
	port               uint16
	addr               netip.Addr
	client             string
	gen                uint64
	task, phase        string
	upBytes, downBytes int64
	start              time.Time
}

// runTunnel is a tunnel's goroutine. Its frame stays small (the relay is most of its
// stack while the tunnel idles); the accounting runs after the relay, in finishTunnel.
func (s *Server) runTunnel(client, up net.Conn, buffered []byte, t *tunnelDone) {
	t.start = time.Now()
	done := make(chan int64, 1)
	clock := newIdleClock(s.cfg.TunnelIdleTimeout)
	var keepAlive *time.Timer
	if tc, ok := up.(*net.TCPConn); ok {
		keepAlive = time.AfterFunc(tunnelKeepAliveAfter, func() { _ = tc.SetKeepAliveConfig(upstreamKeepAlive) })
	}
	var ended atomic.Int32
	go copyDirection(client, up, nil, clock, &ended, done)
	t.upBytes = copyDirection(up, client, buffered, clock, &ended, nil)
	t.downBytes = <-done
	if keepAlive != nil {
		keepAlive.Stop()
	}
	client.Close()
	up.Close()
	s.finishTunnel(t)
}

// tunnelKeepAliveAfter is how long a tunnel lives before its upstream side gets TCP
// keep-alive. Its probes keep the flow state of NATs and firewalls between the proxy and
// the destination alive while the tunnel idles (cloud NATs drop idle flows after 4 to
// 6 minutes, well within --tunnel-idle-timeout); the client's own probes end at the
// proxy. A variable for tests.
var tunnelKeepAliveAfter = keepAliveIdle * time.Second

//go:noinline
func (s *Server) finishTunnel(t *tunnelDone) {
	defer s.tunnels.Done()
	s.tracker.remove(t.entry)
	s.proxyLn.release()
	s.metrics.bytesUp.Add(float64(t.upBytes))
	s.metrics.bytesDown.Add(float64(t.downBytes))
	if s.log.Enabled(context.Background(), slog.LevelInfo) {
		s.logLine(slog.LevelInfo, "tunnel closed", slog.String("type", typeConnect),
			slog.String("host", t.host), slog.Int("port", int(t.port)), slog.String("addr", t.addr.String()),
			slog.String("client", t.client), slog.Int64("bytes_up", t.upBytes), slog.Int64("bytes_down", t.downBytes),
			slog.Float64("duration_seconds", time.Since(t.start).Seconds()), slog.Uint64("generation", t.gen),
			slog.String("task", t.task), slog.String("phase", t.phase))
	}
	s.metrics.activeConnect.Dec()
}

// addTunnel counts a new tunnel for the drain, unless the drain has begun.
func (s *Server) addTunnel() bool {
	s.tunnelMu.Lock()
	defer s.tunnelMu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.tunnels.Add(1)
	return true
}

// halfCloser is what *net.TCPConn offers for a clean one-way EOF.
type halfCloser interface {
	CloseWrite() error
}

// copyDirection relays one direction (pre first), ends it, and reports the count on done
// when done is not nil. clock ends the relay when both directions stay idle (see
// idleClock); the copy itself is pump's. Kept out of line so an idle direction's stack
// stays at its smallest size.
//
//go:noinline
func copyDirection(dst, src net.Conn, pre []byte, clock *idleClock, ended *atomic.Int32, done chan<- int64) int64 {
	var (
		n    int64
		err  error
		bulk bool
	)
	if len(pre) > 0 {
		var w int
		w, err = dst.Write(pre)
		n = int64(w)
	}
	for err == nil {
		clock.arm(src)
		var m int64
		m, err = pump(dst, src, &bulk)
		n += m
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if m > 0 {
			clock.touch()
		}
		if !clock.idle() {
			err = nil // a period ended with traffic somewhere: go on
		}
	}
	endDirection(dst, src, err, ended.Add(1) == 2)
	if done != nil {
		done <- n
	}
	return n
}

// endDirection ends one direction: on EOF it passes the EOF on (half-close) so the
// other direction keeps flowing; on an error it closes both, which also stops the
// other direction's copy. src has already said EOF, so shutting its read side too
// would only cost a system call per tunnel; and when the other direction has ended too
// (last), the tunnel closes both sockets next, which passes the EOF on by itself.
func endDirection(dst, src net.Conn, err error, last bool) {
	if d, ok := dst.(halfCloser); ok && err == nil {
		if !last {
			_ = d.CloseWrite()
		}
		return
	}
	dst.Close()
	src.Close()
}
