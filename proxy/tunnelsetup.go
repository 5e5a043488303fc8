package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// openTunnel dials the checked address and relays bytes. ctx is the request's, which
// cancel ends; the dial has contexts of its own (connio.DialStop), which a swap that
// refuses the tunnel while it is dialled ends with the request, and which the drain
// reaches through the function openTunnel hands to rearm (nil: none) to end the request
// with. Both sides stay *net.TCPConn so ReadFrom splices in the kernel; each direction
// half-closes on EOF; bytes the client sent along with the CONNECT (buffered) are
// forwarded first. It reports whether the tunnel started; if it did not, it has
// answered the client and the caller closes the connection.
func (s *Server) openTunnel(ctx context.Context, cancel context.CancelFunc, rearm func(context.CancelFunc), r *http.Request, client net.Conn, buffered []byte, rs *RuleSet, v Verdict) bool {
	ts := &tunnelSetup{s: s, r: r, v: v,
		tunnelLink: &tunnelLink{client: client, cancel: cancel, confirmed: make(chan struct{})}}
	if rearm != nil {
		rearm(ts.end)
	}
	if ctx.Err() != nil { // the drain ended the request before rearm
		ts.dial.Stop()
	}
	ts.entry = &liveConn{typ: typeConnect, name: v.Name, addr: v.Addrs[0], port: v.Port}
	ts.entry.close = ts.tunnelLink.cut
	s.tracker.add(ts.entry)
	defer ts.release()
	c, addr, err := s.dialVerdict(ctx, &ts.dial, &ts.v, false, rs, ts.entry)
	if ts.dialled(c) || errors.Is(err, dnsupstream.ErrPolicyChanged) {
		ts.refuse() // the one line of a CONNECT the swap refused before it connected
		return false
	}
	if !ts.recordDial(ctx, rs, addr, err) || !ts.count() || !ts.confirm() {
		return false
	}
	ts.handOver(rs, addr, buffered)
	return true
}

// tunnelSetup is a CONNECT from its dial to its hand-over to the relay.
type tunnelSetup struct {
	s     *Server
	r     *http.Request
	v     Verdict // the CONNECT's, then the dial's (the address dialled) or a refusal's
	entry *liveConn
	*tunnelLink
	counted bool // for the drain (addTunnel), not yet given back
	handed  bool // the relay owns the tunnel
}

// tunnelLink is what a tunnel being set up shares with a swap's cut (cut), under mu.
// The tracker's entry holds it for the tunnel's life, so it holds nothing of the
// request.
//
// The tunnel is live from its dial on, so a swap that refuses it while it is dialled
// stops the dial (nothing opens to the destination once the swap has returned); one
// that cuts it while it is set up closes the upstream side and leaves the client a
// clean answer rather than a bare EOF: a 403 if the 200 is not on its way yet, else
// the 200 and then the close. The 200 is written without the lock; --header-timeout
// bounds that write, and a cut bounds it to httpfront.LingerTime, which is all a client that
// reads nothing can hold the swap (the cuts' waits overlap: see tracker.closeIf).
// Once the tunnel is established, a cut closes both sides.
type tunnelLink struct {
	client net.Conn
	cancel context.CancelFunc
	dial   connio.DialStop

	mu    sync.Mutex
	state int // setupDialling, setupSettingUp, setupConfirming or setupEstablished
	cutBy bool
	up    *net.TCPConn
	// confirmed is closed once the write of the 200 has returned.
	confirmed chan struct{}
}

// The states of a tunnelLink.
const (
	setupDialling = iota
	setupSettingUp
	setupConfirming
	setupEstablished
)

// end ends the request and its dial.
func (l *tunnelLink) end() { l.cancel(); l.dial.Stop() }

// cut is the tunnel's close for the tracker: a swap's cut, at any state.
func (l *tunnelLink) cut() (settle func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == setupDialling {
		l.end()
	} else if l.up != nil { // nil: the dial failed, the tunnel is being dropped
		l.up.Close()
	}
	l.cutBy = true
	client := l.client
	switch l.state {
	case setupConfirming:
		// The 200 goes out, bounded, and the client's side closes before the swap
		// returns (the owner closes it too, later).
		_ = client.SetWriteDeadline(time.Now().Add(httpfront.LingerTime))
		return func() {
			<-l.confirmed
			client.Close()
		}
	case setupEstablished:
		client.Close()
	}
	return nil
}

// release gives back what the setup took, unless the relay owns it: every return of
// openTunnel goes through it, and a panic (which the front recovers) too. Nothing may
// outlive it: an entry a swap would cut to no avail, an upstream socket, a count that
// would hold the drain to its deadline, a cut waiting on a 200 that never went out.
func (ts *tunnelSetup) release() {
	if ts.handed {
		return
	}
	ts.mu.Lock()
	if ts.state == setupConfirming {
		ts.state = setupEstablished
		close(ts.confirmed)
	}
	ts.mu.Unlock()
	if ts.up != nil {
		ts.up.Close()
	}
	ts.s.tracker.remove(ts.entry)
	if ts.counted {
		ts.s.tunnels.Done()
	}
}

// dialled records the upstream connection the dial returned (nil if it failed) and
// reports whether a swap cut the tunnel while it was dialled.
func (l *tunnelLink) dialled(up *net.TCPConn) (cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up, l.state = up, setupSettingUp
	return l.cutBy
}

// refuse answers a CONNECT that a swap refused while it was set up, with the decision
// of the rule set in force.
func (ts *tunnelSetup) refuse() {
	s := ts.s
	s.tracker.remove(ts.entry)
	if ts.up != nil {
		ts.up.Close()
	}
	cur := s.current.Load()
	ts.v = s.redecide(cur, ts.v)
	if ts.v.Allowed { // cut by a swap that has since been swapped back
		ts.v.Allowed, ts.v.Reason = false, ReasonPolicyChanged
	}
	s.record(cur, typeConnect, ts.v, ts.r.RemoteAddr)
	_ = ts.client.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
	_ = refusalResponse(ts.r, cur, typeConnect, ts.v).Write(ts.client)
}

// fail answers a CONNECT that ends unserved, bounded as the front's last answers are.
func (ts *tunnelSetup) fail(status, reason string) {
	_ = ts.client.SetWriteDeadline(time.Now().Add(ts.s.cfg.HeaderTimeout))
	_, _ = io.WriteString(ts.client, httpfront.ErrorAnswer(status, reason))
}

// recordDial writes the CONNECT's decision line, naming addr, the address dialled,
// which fail-over may have moved past the first candidate, and reports whether the
// dial (its error err) succeeded; if not, it answers the client.
func (ts *tunnelSetup) recordDial(ctx context.Context, rs *RuleSet, addr netip.Addr, err error) bool {
	s, v := ts.s, &ts.v
	if addr.IsValid() {
		v.Addr = addr
	}
	s.record(rs, typeConnect, *v, ts.r.RemoteAddr)
	if err == nil {
		return true
	}
	s.tracker.remove(ts.entry)
	if ctx.Err() != nil && s.draining.Load() { // the drain's deadline, not the upstream
		ts.fail("503 Service Unavailable", "draining")
		return false
	}
	s.log.Warn("dial failed", "type", typeConnect, "host", blockedHost(*v), "port", v.Port, "client", ts.r.RemoteAddr, "error", err.Error())
	ts.fail("502 Bad Gateway", "dial-failed")
	return false
}

// count counts the tunnel for the drain before the client hears 200: a drain that
// starts now waits for this tunnel instead of cutting one it just confirmed. It
// reports false, having answered the client, once the drain has begun.
func (ts *tunnelSetup) count() bool {
	if !ts.s.addTunnel() {
		ts.s.tracker.remove(ts.entry)
		ts.up.Close()
		ts.fail("503 Service Unavailable", "draining")
		return false
	}
	ts.counted = true
	return true
}

// confirm writes the 200 and reports whether the tunnel is established, uncut.
func (ts *tunnelSetup) confirm() bool {
	// The 200 is bounded as the front's last answers are: a client that reads nothing
	// (its buffers full of answers to requests it pipelined) must not hold a worker and
	// a connection slot. Set before the state says confirming, so a cut's shorter
	// deadline comes after it.
	_ = ts.client.SetWriteDeadline(time.Now().Add(ts.s.cfg.HeaderTimeout))
	ts.mu.Lock()
	if ts.cutBy {
		ts.mu.Unlock()
		ts.counted = false
		ts.s.tunnels.Done()
		ts.refuse()
		return false
	}
	ts.state = setupConfirming
	ts.mu.Unlock()
	_, err := io.WriteString(ts.client, "HTTP/1.1 200 Connection established\r\n\r\n")
	close(ts.confirmed)
	ts.mu.Lock()
	ts.state = setupEstablished
	cutWhileConfirming := ts.cutBy
	ts.mu.Unlock()
	// If not, the deferred release closes up and gives back the entry and the count.
	return err == nil && !cutWhileConfirming
}

// handOver starts the relay of the established tunnel, which then owns it.
func (ts *tunnelSetup) handOver(rs *RuleSet, addr netip.Addr, buffered []byte) {
	s, v, up, client := ts.s, ts.v, ts.up, ts.client
	_ = client.SetWriteDeadline(time.Time{})
	// The tunnel keeps only what it logs: not the request, whose memory would otherwise
	// live as long as the tunnel.
	t := &tunnel{upward: connio.NewDirection(up, client, buffered), downward: connio.NewDirection(client, up, nil),
		entry: ts.entry, typ: typeConnect, host: blockedHost(v), port: v.Port, addr: addr, clientAddr: ts.r.RemoteAddr,
		gen: rs.Generation, task: rs.Task, phase: rs.Phase}
	// A target by name gets its TLS server name checked (an address literal is what an
	// IP/CIDR rule allowed). Both sides of a tunnel are TCP, the gate's relay.
	if v.Name != "" && t.upward.TCP() {
		t.upward.SetGate(&helloGate{s: s, t: t})
	}
	s.startTunnel(t)
	s.metrics.activeConnect.Inc()
	ts.handed = true
	go s.runTunnel(t)
}
