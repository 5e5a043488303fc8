package proxy

import (
	"errors"
	"net/netip"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
	"github.com/compass-egress/compass-egress/proxy/tlshello"
)

// helloGate holds the first bytes a client sends in a tunnel to a named target until
// they show whether they open a TLS handshake and, if they do, which server its
// ClientHello names (see tlshello). Bytes that do not start a TLS record pass at
// once. A name other than the target's must be one the policy allows by name at the
// tunnel's port; a hello that cannot be read is refused. Only the client's direction
// has a gate, and only until it has decided: the upstream's direction never waits for
// it, so protocols whose server speaks first work as before.
type helloGate struct {
	s     *Server
	t     *tunnel
	held  []byte // a ClientHello's bytes so far
	parse tlshello.Parser
}

// errServerNameRefused ends a tunnel whose ClientHello its gate refused.
var errServerNameRefused = errors.New("proxy: TLS server name refused")

// Feed takes the next bytes the client sent and returns those that may go upstream now
// (none while a hello is incomplete) and whether the gate has decided.
func (g *helloGate) Feed(p []byte) (out []byte, done bool, err error) {
	if g.Skips(p) {
		return p, true, nil
	}
	g.held = append(g.held, p...)
	name, more, err := g.parse.Read(g.held)
	if err == nil && more {
		if len(g.held) <= tlshello.MaxStream {
			return nil, false, nil
		}
		err = tlshello.ErrMalformed
	}
	if !g.s.decideServerName(g.t, name, g.parse.ECH(), err) {
		return nil, true, errServerNameRefused
	}
	return g.held, true, nil
}

// Skips reports whether p, the first bytes of the stream, start no TLS record (see
// tlshello.StartsRecord).
func (g *helloGate) Skips(p []byte) bool {
	return len(g.held) == 0 && !tlshello.StartsRecord(p[0])
}

// decideServerName rules on t's ClientHello: its server name, whether it carries an
// encrypted one (ech), or err: it could not be read. It records a decision of its own
// (type tls) for a name other than the target's, for an encrypted hello and for a
// refusal, which it answers with a TLS alert.
//
// An encrypted hello is refused unless the policy is public: the name outside is the
// client's choice, and a front end that accepts ECH serves the name inside, which no
// proxy can read (browsers' ECH "GREASE" looks the same by design).
func (s *Server) decideServerName(t *tunnel, name string, ech bool, err error) bool {
	v := Verdict{Host: name, Port: t.port, Addr: t.addr}
	switch canon, cerr := policy.CanonicalHostname(name); {
	case err != nil:
		v.Host, v.Reason = t.host, ReasonMalformedHello
	case name != "" && cerr != nil:
		v.Reason = ReasonInvalidHost
	default:
		if name != "" && canon != t.host {
			v.Name = canon
		} else if !ech {
			return true // the target's own name, or none
		}
		// Recorded before the rule set is read: a swap that publishes a new set after
		// this read sweeps the tunnel with them (see tracker.closeIf).
		s.tracker.setServerName(t.entry, v.Name, ech)
	}
	if v.Host == "" {
		v.Host = t.host
	}
	cur := s.current.Load()
	if v.Reason == "" {
		v.Allowed, v.Reason, v.Rule = helloDecision(cur, blockedHost(v), ech, t.port)
	}
	s.record(cur, typeTLS, v, t.clientAddr)
	if v.Allowed {
		return true
	}
	client := t.upward.Src()
	_ = client.SetWriteDeadline(time.Now().Add(httpfront.LingerTime))
	_, _ = client.Write(tlshello.UnrecognizedNameAlert)
	return false
}

// helloDecision is rs's decision on what a tunnel's ClientHello asked for beyond its
// target: name, by name at port ("" for nothing but the target, whose own decision
// stands), and, if ech, a name it hid, allowed only under public. A swap re-decides a
// tunnel with it, as the gate decided.
func helloDecision(rs *RuleSet, name string, ech bool, port uint16) (allowed bool, reason, rule string) {
	if ech && rs.Mode() != policy.ModePublic {
		return false, ReasonEncryptedHello, ""
	}
	if name == "" {
		return true, "", ""
	}
	dec := rs.Matcher.Decide(name, netip.Addr{}, port)
	return dec.Allowed, string(dec.Reason), ruleString(dec.Rule)
}
