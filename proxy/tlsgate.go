package proxy

import (
	"errors"
	"net/netip"
	"time"

	"github.com/compass-egress/compass-egress/policy"
)

// helloGate holds the first bytes a client sends in a tunnel to a named target until
// they show whether they open a TLS handshake and, if they do, which server its
// ClientHello names (see tlshello.go). Bytes that do not start a handshake pass at
// once. A name other than the target's must be one the policy allows by name at the
// tunnel's port; a hello that cannot be read is refused. Only the client's direction
// has a gate, and only until it has decided: the upstream's direction never waits for
// it, so protocols whose server speaks first work as before.
type helloGate struct {
	s    *Server
	t    *tunnel
	held []byte // a ClientHello's bytes so far
}

// errServerNameRefused ends a tunnel whose ClientHello its gate refused.
var errServerNameRefused = errors.New("proxy: TLS server name refused")

// feed takes the next bytes the client sent and returns those that may go upstream now
// (none while a hello is incomplete) and whether the gate has decided.
func (g *helloGate) feed(p []byte) (out []byte, done bool, err error) {
	if len(g.held) == 0 && p[0] != tlsRecordHandshake {
		return p, true, nil
	}
	g.held = append(g.held, p...)
	name, more, err := helloServerName(g.held)
	if err == nil && more {
		if len(g.held) <= maxHelloStream {
			return nil, false, nil
		}
		err = errMalformedHello
	}
	if !g.s.decideServerName(g.t, name, err) {
		return nil, true, errServerNameRefused
	}
	return g.held, true, nil
}

// tlsUnrecognizedName is the fatal alert a refused hello gets: its client reports the
// server name as unrecognised rather than a bare reset.
var tlsUnrecognizedName = []byte{21, 3, 3, 0, 2, 2, tlsAlertUnrecognized}

// decideServerName rules on the server name of t's ClientHello (err: the hello could not
// be read). It records a decision of its own (type tls) for a name other than the
// target's, and for a refusal, which it answers with a TLS alert.
func (s *Server) decideServerName(t *tunnel, name string, err error) bool {
	v := Verdict{Host: name, Port: t.port, Addr: t.addr}
	if err != nil {
		v.Host, v.Reason = t.host, ReasonMalformedHello
	} else if name == "" {
		return true
	} else if canon, cerr := policy.CanonicalHostname(name); cerr != nil {
		v.Reason = ReasonInvalidHost
	} else if canon == t.host {
		return true
	} else {
		v.Name = canon
		// Recorded before the rule set is read: a swap that publishes a new set after
		// this read sweeps the tunnel with its name (see tracker.closeIf).
		s.tracker.setServerName(t.entry, canon)
	}
	cur := s.current.Load()
	if v.Reason == "" {
		dec := cur.Matcher.Decide(v.Name, netip.Addr{}, t.port)
		v.Allowed, v.Reason, v.Rule = dec.Allowed, string(dec.Reason), ruleString(dec.Rule)
	}
	s.record(cur, typeTLS, v, t.clientAddr)
	if v.Allowed {
		return true
	}
	client := t.upward.src
	_ = client.SetWriteDeadline(time.Now().Add(lingerTime))
	_, _ = client.Write(tlsUnrecognizedName)
	return false
}

// serverNameAllowed reports whether rs allows a tunnel's TLS server name (one other
// than its target's, "" for none) by name at port.
func serverNameAllowed(rs *RuleSet, name string, port uint16) bool {
	return name == "" || rs.Matcher.Decide(name, netip.Addr{}, port).Allowed
}
