package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// decideTunnel decides a CONNECT target under rs and records a refusal; openTunnel
// records an allowed verdict once it knows which address it dialled.
func (s *Server) decideTunnel(ctx context.Context, rs *RuleSet, target, client string) Verdict {
	v := Verdict{Host: target}
	if h, port, reason := splitAuthority(target, 0); reason != "" {
		v.Reason = reason
	} else {
		v = s.decide(ctx, rs, h, port)
	}
	if !v.Allowed {
		s.record(s.decidedBy(rs, v), typeConnect, v, client)
	}
	return v
}

// decidedBy is the rule set a verdict made under rs is logged, counted and explained
// under: rs, unless a swap stopped the verdict's lookup (ReasonPolicyChanged), which
// makes it the refusal of the set in force. Under rs it would be counted after the swap
// reported rs's blocked attempts, and so in no report.
func (s *Server) decidedBy(rs *RuleSet, v Verdict) *RuleSet {
	if v.Reason == ReasonPolicyChanged {
		return s.current.Load()
	}
	return rs
}

// openTunnel dials the checked address and relays bytes. ctx is the request's, which
// cancel ends; the dial has contexts of its own (dialStop), which a swap that refuses
// the tunnel while it is dialled ends with the request, and which the drain reaches
// through the function openTunnel hands to rearm (nil: none) to end the request with.
// Both sides stay *net.TCPConn so ReadFrom splices in the kernel; each direction
// half-closes on EOF; bytes the client sent along with the CONNECT (buffered) are
// forwarded first. It reports whether the tunnel started; if it did not, it has
// answered the client and the caller closes the connection.
func (s *Server) openTunnel(ctx context.Context, cancel context.CancelFunc, rearm func(context.CancelFunc), r *http.Request, client net.Conn, buffered []byte, rs *RuleSet, v Verdict) bool {
	// The answers that end a CONNECT unserved are bounded as the front's last answers are.
	fail := func(status, reason string) {
		_ = client.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
		_, _ = io.WriteString(client, errorAnswer(status, reason))
	}
	// The tunnel is live from its dial on, so a swap that refuses it while it is dialled
	// stops the dial (nothing opens to the destination once the swap has returned); one
	// that cuts it while it is set up closes the upstream side and leaves the client a
	// clean answer rather than a bare EOF: a 403 if the 200 is not on its way yet, else
	// the 200 and then the close. The 200 is written without the lock; --header-timeout
	// bounds that write, and a cut bounds it to lingerTime, which is all a client that
	// reads nothing can hold the swap (the cuts' waits overlap: see tracker.closeIf).
	// Once the tunnel is established, a cut closes both sides.
	const (
		dialling = iota
		settingUp
		confirming
		established
	)
	var (
		mu    sync.Mutex
		state = dialling
		cut   bool
		up    *net.TCPConn
		// confirmed is closed once the write of the 200 has returned.
		confirmed = make(chan struct{})
		counted   bool // for the drain (addTunnel), not yet given back
		handed    bool // the relay owns the tunnel
		dial      connio.DialStop
	)
	end := func() { cancel(); dial.Stop() }
	if rearm != nil {
		rearm(end)
	}
	if ctx.Err() != nil { // the drain ended the request before rearm
		dial.Stop()
	}
	entry := &liveConn{typ: typeConnect, name: v.Name, addr: v.Addrs[0], port: v.Port}
	entry.close = func() func() {
		mu.Lock()
		defer mu.Unlock()
		if state == dialling {
			end()
		} else if up != nil { // nil: the dial failed, the tunnel is being dropped
			up.Close()
		}
		cut = true
		switch state {
		case confirming:
			// The 200 goes out, bounded, and the client's side closes before the swap
			// returns (the owner closes it too, later).
			_ = client.SetWriteDeadline(time.Now().Add(lingerTime))
			return func() {
				<-confirmed
				client.Close()
			}
		case established:
			client.Close()
		}
		return nil
	}
	s.tracker.add(entry)
	// Every return below gives back what it took; a panic (which the front recovers)
	// gives it back here. Nothing may outlive it: an entry a swap would cut to no
	// avail, an upstream socket, a count that would hold the drain to its deadline, a
	// cut waiting on a 200 that never went out.
	defer func() {
		if handed {
			return
		}
		mu.Lock()
		if state == confirming {
			state = established
			close(confirmed)
		}
		mu.Unlock()
		if up != nil {
			up.Close()
		}
		s.tracker.remove(entry)
		if counted {
			s.tunnels.Done()
		}
	}()
	refuse := func() {
		s.tracker.remove(entry)
		if up != nil {
			up.Close()
		}
		cur := s.current.Load()
		v = s.redecide(cur, v)
		if v.Allowed { // cut by a swap that has since been swapped back
			v.Allowed, v.Reason = false, ReasonPolicyChanged
		}
		s.record(cur, typeConnect, v, r.RemoteAddr)
		_ = client.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
		_ = refusalResponse(r, cur, typeConnect, v).Write(client)
	}
	c, addr, err := s.dialVerdict(ctx, &dial, &v, false, rs, entry)
	mu.Lock()
	up, state = c, settingUp
	cutWhileDialling := cut
	mu.Unlock()
	if cutWhileDialling || errors.Is(err, errPolicyChanged) {
		refuse() // the one line of a CONNECT the swap refused before it connected
		return false
	}
	// The decision line names the address dialled, which fail-over may have moved past
	// the first candidate.
	if addr.IsValid() {
		v.Addr = addr
	}
	s.record(rs, typeConnect, v, r.RemoteAddr)
	if err != nil {
		s.tracker.remove(entry)
		if ctx.Err() != nil && s.draining.Load() { // the drain's deadline, not the upstream
			fail("503 Service Unavailable", "draining")
			return false
		}
		s.log.Warn("dial failed", "type", typeConnect, "host", blockedHost(v), "port", v.Port, "client", r.RemoteAddr, "error", err.Error())
		fail("502 Bad Gateway", "dial-failed")
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
	counted = true
	// The 200 is bounded as the front's last answers are: a client that reads nothing
	// (its buffers full of answers to requests it pipelined) must not hold a worker and
	// a connection slot. Set before the state says confirming, so a cut's shorter
	// deadline comes after it.
	_ = client.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
	mu.Lock()
	if cut {
		mu.Unlock()
		counted = false
		s.tunnels.Done()
		refuse()
		return false
	}
	state = confirming
	mu.Unlock()
	_, err = io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n")
	close(confirmed)
	mu.Lock()
	state = established
	cutWhileConfirming := cut
	mu.Unlock()
	if err != nil || cutWhileConfirming {
		return false // the deferred release closes up and gives back the entry and the count
	}
	_ = client.SetWriteDeadline(time.Time{})
	// The tunnel keeps only what it logs: not the request, whose memory would otherwise
	// live as long as the tunnel.
	t := &tunnel{upward: connio.NewDirection(up, client, buffered), downward: connio.NewDirection(client, up, nil),
		entry: entry, host: blockedHost(v), port: v.Port, addr: addr, clientAddr: r.RemoteAddr,
		gen: rs.Generation, task: rs.Task, phase: rs.Phase}
	// A target by name gets its TLS server name checked (an address literal is what an
	// IP/CIDR rule allowed). Both sides of a tunnel are TCP, the gate's relay.
	if v.Name != "" && t.upward.TCP() {
		t.upward.SetGate(&helloGate{s: s, t: t})
	}
	s.startTunnel(t)
	s.metrics.activeConnect.Inc()
	handed = true
	go s.runTunnel(t)
	return true
}

// tunnel is an established tunnel: what its two relay goroutines share, and what it
// reports when it closes. It lives behind one pointer so that the goroutines' frames
// stay small (see direction).
type tunnel struct {
	upward, downward connio.Direction // client to upstream, and back
	clock            *connio.IdleClock
	ended            atomic.Int32 // directions that have ended
	finishing        bool         // finishTunnel has begun (on the last direction's goroutine)
	// upEnded and downEnded are relayRunning, relayEndedFirst or relayEndedLast
	// (recoverRelay): what each direction has done of its ending.
	upEnded, downEnded uint8
	// idle cuts an idle tunnel whose directions are blocked in writes to peers that
	// read nothing, which no read deadline ends, and shows the copies the progress of
	// writes to peers that read slowly (see idleWatch).
	idle connio.IdleWatch

	entry       *liveConn
	host        string
	port        uint16
	addr        netip.Addr
	clientAddr  string
	gen         uint64
	task, phase string
	start       time.Time
}

// runTunnel relays the client's bytes upstream on the goroutine that starts the
// tunnel, and the upstream's back on a second one. Whichever direction ends last
// closes the tunnel.
func (s *Server) runTunnel(t *tunnel) {
	go s.relayDirection(t, &t.downward, &t.downEnded)
	s.relayDirection(t, &t.upward, &t.upEnded)
}

// startTunnel starts t's clocks. It runs before the relay's goroutines, under
// openTunnel's release of what a panic would leave.
func (s *Server) startTunnel(t *tunnel) {
	t.start = time.Now()
	t.clock = connio.NewIdleClock(s.cfg.TunnelIdleTimeout)
	keepAlive, _ := t.upward.Dst().(*net.TCPConn)
	if t.upward.TCP() {
		t.clock.WatchSockets(keepAlive, t.upward.Src().(*net.TCPConn))
	}
	t.idle.Start(t.clock, keepAlive, tunnelKeepAliveAfter, func(panicked any) {
		if panicked != nil {
			s.recovered(componentTunnel, typeConnect, t.clientAddr, panicked)
		}
		// Both sides close, which ends both directions: the last one finishes the tunnel.
		t.upward.Close()
	})
}

// relayDirection runs direction d of t, whose ending it records in ended, and, if it is
// the last to end, closes the tunnel. A panic is recovered at the top, by a deferred call: not in the copy loop,
// whose frames must stay small (see direction) and whose reads cheap.
func (s *Server) relayDirection(t *tunnel, d *connio.Direction, ended *uint8) {
	defer s.recoverRelay(t, ended)
	err := d.Copy(t.clock)
	last := t.ended.Add(1) == 2 // after d's count is final: the closing one reads it
	*ended = relayEndedFirst
	if last {
		*ended = relayEndedLast
	}
	d.End(err, last)
	if last {
		s.finishTunnel(t)
	}
}

// What a direction has done of its ending, for recoverRelay.
const (
	relayRunning    = iota // copying: not counted in tunnel.ended
	relayEndedFirst        // counted; the other direction finishes the tunnel
	relayEndedLast         // counted; this one finishes the tunnel
)

// recoverRelay ends the tunnel whose direction (its ending in ended) panicked, and that tunnel alone: both
// sides close, which ends the other direction, the tunnel leaves the tracker at once,
// and it is finished once, by whichever direction is the last to end (finishTunnel's
// own releases are deferred, so one that panicked has given them back).
func (s *Server) recoverRelay(t *tunnel, ended *uint8) {
	p := recover()
	if p == nil {
		return
	}
	s.recovered(componentTunnel, typeConnect, t.clientAddr, p)
	t.upward.Close()
	s.tracker.remove(t.entry)
	switch *ended {
	case relayRunning:
		if t.ended.Add(1) == 2 {
			s.finishTunnel(t)
		}
	case relayEndedLast:
		if !t.finishing {
			s.finishTunnel(t)
		}
	}
}

// tunnelKeepAliveAfter is how long a tunnel lives before its upstream side gets TCP
// keep-alive. Its probes keep the flow state of NATs and firewalls between the proxy and
// the destination alive while the tunnel idles (cloud NATs drop idle flows after 4 to
// 6 minutes, well within --tunnel-idle-timeout); the client's own probes end at the
// proxy. A variable for tests.
var tunnelKeepAliveAfter = connio.KeepAliveIdle * time.Second

//go:noinline
func (s *Server) finishTunnel(t *tunnel) {
	t.finishing = true
	// Deferred, as they are counts that must be given back once, a panic or not.
	defer s.tunnels.Done()
	defer s.metrics.activeConnect.Dec()
	defer s.proxyLn.Release()
	t.idle.Stop()
	t.upward.Close()
	s.tracker.remove(t.entry)
	s.metrics.bytesUp.Add(float64(t.upward.Moved()))
	s.metrics.bytesDown.Add(float64(t.downward.Moved()))
	if s.log.Enabled(context.Background(), slog.LevelInfo) {
		s.logLine(slog.LevelInfo, "tunnel closed", slog.String("type", typeConnect),
			slog.String("host", t.host), slog.Int("port", int(t.port)), slog.String("addr", t.addr.String()),
			slog.String("client", t.clientAddr), slog.Int64("bytes_up", t.upward.Moved()), slog.Int64("bytes_down", t.downward.Moved()),
			slog.Float64("duration_seconds", time.Since(t.start).Seconds()), slog.Uint64("generation", t.gen),
			slog.String("task", t.task), slog.String("phase", t.phase))
	}
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
