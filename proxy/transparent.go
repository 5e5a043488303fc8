package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/fqdncache"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
	"github.com/compass-egress/compass-egress/proxy/tlshello"
	"github.com/compass-egress/compass-egress/proxy/transparent"
)

// Reasons of the transparent listener's refusals.
const (
	ReasonSNIAddressMismatch  = "sni-address-mismatch"  // a ClientHello's name does not resolve to the original address
	ReasonHostAddressMismatch = "host-address-mismatch" // a request's Host does not resolve to the original address, or names another port
	ReasonNotRedirected       = "not-redirected"        // a connection to the transparent port with no original destination of its own
)

// transparentOrigin is where a transparent connection was going and what it carried
// (zero for the explicit proxy's connections): its records carry both.
type transparentOrigin struct {
	dst      netip.AddrPort
	protocol string
}

// listenTransparent binds Config.TransparentListen; serveTransparent serves it.
func (s *Server) listenTransparent() error {
	ln, err := connio.ListenTCP(s.cfg.TransparentListen, net.ListenConfig{})
	if err != nil {
		return err
	}
	s.transparent = transparent.New(transparent.Config{
		Listener: ln, Lookup: s.cfg.origDst, SniffWait: s.cfg.transparentSniffWait, HelloTimeout: s.cfg.HeaderTimeout,
		// The explicit listener's slots: one --max-connections bounds both, and every
		// owner of a connection (the front, a tunnel) gives its slot back there.
		Hold: s.proxyLn.Hold, Release: s.proxyLn.Release,
		Handler: transparentHandler{s},
		AcceptFailed: func(err error, retry time.Duration) {
			s.log.Warn("accept failed", "type", typeTransparent, "error", err.Error(), "retry_seconds", retry.Seconds())
		},
		Recovered: func(client string, p any) { s.recovered(componentFront, typeTransparent, client, p) },
	})
	return nil
}

// transparentHandler is the Server as the transparent listener sees it.
type transparentHandler struct{ s *Server }

// NotRedirected refuses a connection made to the transparent port itself: a loop, or
// a client that found the port.
func (h transparentHandler) NotRedirected(c *net.TCPConn, source netip.AddrPort, err error) {
	s := h.s
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	v := Verdict{Host: local.Addr().String(), Port: local.Port(), Addr: local.Addr(), Reason: ReasonNotRedirected}
	s.recordOrigin(s.current.Load(), typeTransparent, v, source.String(), transparentOrigin{dst: local, protocol: transparent.TCP})
	s.log.Debug("transparent connection not redirected", "client", source.String(), "error", err.Error())
	c.Close()
	s.proxyLn.Release()
}

// ServeTransparent decides c and relays it to its original destination alone: an
// HTTP connection through the front, which decides each request on its Host, anything
// else as a tunnel, decided once.
func (h transparentHandler) ServeTransparent(c *transparent.Conn) {
	s := h.s
	if c.Protocol == transparent.HTTP {
		s.front.ServeOrigin(c.TCPConn, c.Dst)
		return
	}
	o := transparentOrigin{dst: c.Dst, protocol: c.Protocol}
	rs := s.current.Load()
	entry := &liveConn{typ: typeTransparent, addr: c.Dst.Addr(), port: c.Dst.Port(), encryptedHello: c.ECH}
	v, learned := s.decideTransparent(rs, c)
	if !v.Allowed {
		s.recordOrigin(s.decidedBy(rs, v), typeTransparent, v, c.Source.String(), o)
		if c.Protocol == transparent.TLS {
			_ = c.SetWriteDeadline(time.Now().Add(httpfront.LingerTime))
			_, _ = c.Write(tlshello.UnrecognizedNameAlert)
		}
		c.Close()
		s.proxyLn.Release()
		return
	}
	entry.name = v.Name
	done := func() {}
	if learned {
		// The names stay usable while the connection lives, so a swap re-decides it
		// on them however long ago they were answered.
		client, addr := c.Source.Addr(), c.Dst.Addr()
		done = s.fqdn.Hold(client, addr)
		entry.recheck = func(rs *RuleSet) bool { return s.decideLearned(rs, client, c.Dst).Allowed }
	}
	s.openTransparent(rs, v, c, o, entry, done)
}

// decideTransparent is rs's verdict on c, a TLS or TCP connection; learned says it
// was allowed by a name the DNS server answered its client.
func (s *Server) decideTransparent(rs *RuleSet, c *transparent.Conn) (v Verdict, learned bool) {
	dst := c.Dst
	refuse := func(host, reason string) Verdict {
		return Verdict{Host: host, Port: dst.Port(), Addr: dst.Addr(), Reason: reason}
	}
	if c.Protocol == transparent.TLS {
		switch {
		case c.HelloErr != nil:
			return refuse(dst.Addr().String(), ReasonMalformedHello), false
		case c.ECH:
			if ok, reason, _ := helloDecision(rs, "", true, dst.Port()); !ok {
				return refuse(orAddr(c.ServerName, dst), reason), false
			}
		}
		if _, err := netip.ParseAddr(c.ServerName); err == nil { // a name, never an address (RFC 6066 §3)
			return refuse(c.ServerName, ReasonInvalidHost), false
		}
		if c.ServerName != "" {
			v = s.decideNamed(context.Background(), rs, c.Source.Addr(), c.ServerName, dst, ReasonSNIAddressMismatch)
			return s.orAddressRule(rs, dst, v), false
		}
	}
	v = s.decideLearned(rs, c.Source.Addr(), dst)
	return v, v.Allowed && v.Name != ""
}

// orAddressRule is v, a server name's verdict, unless it refused a name no rule denies
// and the rules allow dst's address by itself: a CONNECT to that address, with any
// server name, would be allowed (an address target's hello is not checked), so the
// name cannot take away what the address rule gives. A name a rule denies stays
// refused.
func (s *Server) orAddressRule(rs *RuleSet, dst netip.AddrPort, v Verdict) Verdict {
	if v.Allowed || v.Reason == string(policy.ReasonDenylisted) || rs.Mode() != policy.ModeAllowlist && rs.Mode() != policy.ModeDenylist {
		return v
	}
	if a := s.decider.Decide(context.Background(), rs, dst.Addr().String(), dst.Port()); a.Allowed {
		return a
	}
	return v
}

func orAddr(name string, dst netip.AddrPort) string {
	if name != "" {
		return name
	}
	return dst.Addr().String()
}

// decideNamed decides host (a TLS server name or an HTTP Host, without port) on dst's
// port, as the explicit proxy decides it, and pins the verdict to dst's address: the
// address must be one the sidecar's own resolution of the name gives, or one its DNS
// answered client for the name, else the refusal is mismatch.
func (s *Server) decideNamed(ctx context.Context, rs *RuleSet, client netip.Addr, host string, dst netip.AddrPort, mismatch string) Verdict {
	v := s.decide(ctx, rs, host, dst.Port())
	if !v.Allowed {
		if !v.Addr.IsValid() {
			v.Addr = dst.Addr()
		}
		return v
	}
	return s.pinOrigin(rs, client, dst, v, mismatch)
}

// pinOrigin turns v, an allowed verdict on a name or address, into one that dials
// dst's address alone, if that address is the name's (see decideNamed) and rs allows it.
func (s *Server) pinOrigin(rs *RuleSet, client netip.Addr, dst netip.AddrPort, v Verdict, mismatch string) Verdict {
	addr := dst.Addr()
	known := slices.Contains(v.Addrs, addr) || v.Name != "" && slices.Contains(s.fqdn.Names(client, addr), v.Name)
	if !known || v.Port != dst.Port() {
		v.Allowed, v.Addrs, v.Reason, v.Rule, v.Addr = false, nil, mismatch, "", addr
		return v
	}
	v.Addrs, v.Addr = []netip.Addr{addr}, addr
	if !s.decider.Recheck(rs, v.Name, addr, v.Port) {
		return s.redecide(rs, v)
	}
	return v
}

// decideLearned decides a connection that names nothing of its own on the names rs
// allows of those the DNS server answered client for dst's address, else on the
// address alone (IP and CIDR rules). A refusal names the first learned name, if any.
func (s *Server) decideLearned(rs *RuleSet, client netip.Addr, dst netip.AddrPort) Verdict {
	addr, port := dst.Addr(), dst.Port()
	names := s.fqdn.Names(client, addr)
	for _, n := range names {
		if d := rs.Matcher.Decide(n, addr, port); d.Allowed && !s.decider.Guard.Refuses(rs.Matcher, addr, port) {
			return Verdict{Allowed: true, Host: n, Name: n, Port: port, Addr: addr, Addrs: []netip.Addr{addr},
				Reason: string(d.Reason), Rule: ruleString(d.Rule)}
		}
	}
	v := s.decider.Decide(context.Background(), rs, addr.String(), port)
	if !v.Allowed && len(names) > 0 {
		d := rs.Matcher.Decide(names[0], addr, port)
		v.Host, v.Name, v.Reason, v.Rule = names[0], names[0], string(d.Reason), ruleString(d.Rule)
		if d.Allowed {
			v.Reason, v.Rule = ReasonInternalAddress, ""
		}
	}
	v.Addr = addr
	return v
}

// openTransparent dials the original address of c, allowed by v under rs, and relays
// the connection as a tunnel (the relay, idle watch, drain and swaps of CONNECT
// tunnels), c's ClientHello first. entry is tracked from the dial on; done runs
// when the connection ends.
func (s *Server) openTransparent(rs *RuleSet, v Verdict, c *transparent.Conn, o transparentOrigin, entry *liveConn, done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	link := &tunnelLink{client: c.TCPConn, cancel: cancel, confirmed: make(chan struct{})}
	entry.close = link.cut
	s.tracker.add(entry)
	up, addr, err := s.dialVerdict(ctx, &link.dial, &v, false, rs, entry)
	fail := func() {
		s.tracker.remove(entry)
		if up != nil {
			up.Close()
		}
		c.Close()
		s.proxyLn.Release()
		done()
	}
	if link.dialled(up) || errors.Is(err, dnsupstream.ErrPolicyChanged) {
		cur := s.current.Load()
		v = s.redecide(cur, v)
		if v.Allowed {
			v.Allowed, v.Reason = false, ReasonPolicyChanged
		}
		s.recordOrigin(cur, typeTransparent, v, c.Source.String(), o)
		fail()
		return
	}
	if addr.IsValid() {
		v.Addr = addr
	}
	s.recordOrigin(rs, typeTransparent, v, c.Source.String(), o)
	if err != nil {
		s.log.Warn("dial failed", "type", typeTransparent, "host", blockedHost(v), "port", v.Port, "client", c.Source.String(), "error", err.Error())
		fail()
		return
	}
	if !s.addTunnel() {
		fail()
		return
	}
	link.mu.Lock()
	cut := link.cutBy
	link.state = setupEstablished
	link.mu.Unlock()
	if cut {
		s.tunnels.Done()
		fail()
		return
	}
	t := &tunnel{upward: connio.NewDirection(up, c.TCPConn, c.Hello), downward: connio.NewDirection(c.TCPConn, up, nil),
		entry: entry, typ: typeTransparent, done: done, host: blockedHost(v), port: v.Port, addr: addr,
		clientAddr: c.Source.String(), gen: rs.Generation, task: rs.Task, phase: rs.Phase}
	s.startTunnel(t)
	s.metrics.activeTransparent.Inc()
	go s.runTunnel(t)
}

// originForm makes r, a request on a transparent connection to st.origin, one the
// explicit path reads: an origin-form target becomes http://Host/path.
func originForm(r *http.Request, st *requestState) {
	if r.URL.Host == "" && r.URL.Scheme == "" {
		r.URL.Scheme, r.URL.Host = "http", st.fr.Host
	}
}

// recordAs is the type and origin a request of st is recorded under: transparent,
// protocol http, when it came on a transparent connection.
func (st *requestState) recordAs() (string, transparentOrigin) {
	if !st.origin.IsValid() {
		return typeHTTP, transparentOrigin{}
	}
	return typeTransparent, transparentOrigin{dst: st.origin, protocol: transparent.HTTP}
}

// newFQDNCache is the names the DNS server answered each client, for transparent
// connections that carry no name (see fqdncache).
func newFQDNCache(now func() time.Time) *fqdncache.Cache {
	return fqdncache.New(fqdncache.Limits{}, now)
}
