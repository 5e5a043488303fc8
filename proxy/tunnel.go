package proxy

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
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

// tunnel is an established tunnel: what its two relay goroutines share, and what it
// reports when it closes. It lives behind one pointer so that the goroutines' frames
// stay small (see connio.Direction).
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
	// writes to peers that read slowly (see connio.IdleWatch).
	idle connio.IdleWatch

	entry *liveConn
	typ   string // typeConnect or typeTransparent
	// done, when not nil, runs once the tunnel has ended.
	done        func()
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
			s.recovered(componentTunnel, t.typ, t.clientAddr, panicked)
		}
		// Both sides close, which ends both directions: the last one finishes the tunnel.
		t.upward.Close()
	})
}

// relayDirection runs direction d of t, whose ending it records in ended, and, if it is
// the last to end, closes the tunnel. A panic is recovered at the top, by a deferred call: not in the copy loop,
// whose frames must stay small (see connio.Direction) and whose reads cheap.
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
	s.recovered(componentTunnel, t.typ, t.clientAddr, p)
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
	if t.typ == typeTransparent {
		defer s.metrics.activeTransparent.Dec()
	} else {
		defer s.metrics.activeConnect.Dec()
	}
	defer s.proxyLn.Release()
	if t.done != nil {
		defer t.done()
	}
	t.idle.Stop()
	t.upward.Close()
	s.tracker.remove(t.entry)
	s.metrics.bytesUp.Add(float64(t.upward.Moved()))
	s.metrics.bytesDown.Add(float64(t.downward.Moved()))
	if s.log.Enabled(context.Background(), slog.LevelInfo) {
		s.logLine(slog.LevelInfo, "tunnel closed", slog.String("type", t.typ),
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
