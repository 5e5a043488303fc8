package proxy

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"

	"github.com/compass-egress/compass-egress/net/addrguard"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// Reason codes of refusals that the proxy adds to the policy's own reasons. They appear
// in logs, in the X-Compass-Egress header and as the reason metric label.
const (
	ReasonInternalAddress  = string(policy.ReasonInternalAddress) // resolves to or names an internal address (planning gives it too)
	ReasonNonCanonicalIP   = string(policy.ReasonNonCanonicalIP)  // an address in decimal/octal/hex/short form
	ReasonInvalidHost      = string(policy.ReasonInvalidHost)     // not a valid host name or address
	ReasonInvalidPort      = "invalid-port"                       // missing or out-of-range port
	ReasonUserinfo         = "userinfo"                           // user@ in the authority
	ReasonBadScheme        = "unsupported-scheme"                 // not http or https
	ReasonNotProxyRequest  = "not-proxy-request"                  // origin-form request, PRI, etc.
	ReasonResolveFailed    = "resolve-failed"                     // the name did not resolve
	ReasonUnsupported      = "unsupported-upgrade"                // an Upgrade other than websocket
	ReasonPolicyChanged    = "policy-changed"                     // cut by a swap while being set up
	ReasonHostMismatch     = "host-mismatch"                      // the Host field names another destination than the URI
	ReasonMalformedRequest = httpfront.ReasonMalformedRequest     // a head the proxy refuses to read or to pass on (400, 505)
	ReasonHeadTooLong      = httpfront.ReasonHeadTooLong          // a head over the size bound (431)
	ReasonMalformedHello   = "malformed-tls-hello"                // a tunnel's first bytes open a TLS handshake this proxy cannot read
	ReasonEncryptedHello   = "encrypted-client-hello"             // a tunnel's ClientHello hides its server name (ECH)
)

// Verdict is the outcome of one destination check.
type Verdict struct {
	Allowed bool
	Reason  string
	Rule    string
	// Host is the destination as requested, Name its canonical form ("" for an address).
	Host string
	Name string
	Port uint16
	// Addrs are the checked addresses that passed, in dial order. Only these are dialled.
	Addrs []netip.Addr
	// Addr is the address that decided a refusal, when one did.
	Addr netip.Addr
}

// maxDialAddrs bounds the checked addresses a verdict keeps, in the resolver's order.
// Whoever serves a name chooses how many addresses it has (thousands in one TCP
// answer); a request keeps its verdict while it lives, and a dial tries each address
// with --dial-timeout: 64 is ten minutes of fail-over already.
const maxDialAddrs = 64

// Decider checks destinations against a rule set: resolve once, check every
// candidate, keep the ones that pass.
type Decider struct {
	Resolver Resolver
	Guard    *addrguard.Guard
}

// splitAuthority splits "host", "host:port" or "[v6]:port" and checks the port.
// defaultPort 0 means the port is required (CONNECT).
func splitAuthority(authority string, defaultPort uint16) (string, uint16, string) {
	host, portStr := authority, ""
	if strings.HasPrefix(authority, "[") {
		end := strings.IndexByte(authority, ']')
		if end < 0 {
			return "", 0, ReasonInvalidHost
		}
		host = authority[1:end]
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return "", 0, ReasonInvalidHost
		}
		rest := authority[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return "", 0, ReasonInvalidHost
			}
			portStr = rest[1:]
		}
	} else {
		switch strings.Count(authority, ":") {
		case 0:
		case 1:
			i := strings.IndexByte(authority, ':')
			host, portStr = authority[:i], authority[i+1:]
		default:
			return "", 0, ReasonInvalidHost // an IPv6 address needs brackets
		}
	}
	if portStr == "" {
		if defaultPort == 0 {
			return "", 0, ReasonInvalidPort
		}
		return host, defaultPort, ""
	}
	for _, c := range portStr {
		if c < '0' || c > '9' {
			return "", 0, ReasonInvalidPort
		}
	}
	// A port is written without leading zeros: the Host field goes upstream as the
	// client wrote it, and a parser there that read "0443" otherwise than as 443 would
	// reach a port this decision never saw.
	p, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || p == 0 || portStr[0] == '0' {
		return "", 0, ReasonInvalidPort
	}
	return host, uint16(p), ""
}

// Decide checks host (a name or an address literal) on port under rs.
func (d *Decider) Decide(ctx context.Context, rs *RuleSet, host string, port uint16) Verdict {
	v := Verdict{Host: host, Port: port}
	refuse := func(reason string) Verdict { v.Reason = reason; return v }
	if host == "" {
		return refuse(ReasonInvalidHost)
	}
	m := rs.Matcher
	var candidates []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return refuse(ReasonInvalidHost)
		}
		candidates = []netip.Addr{a.Unmap()}
	} else {
		var reason string
		if candidates, reason = d.lookUp(ctx, rs, &v); reason != "" {
			return refuse(reason)
		}
	}
	// Candidates are unmapped: ::ffff:127.0.0.1 is 127.0.0.1 to rules, guard and dialler.
	var refusal Verdict
	for _, a := range candidates {
		dec := m.Decide(v.Name, a, port)
		if !dec.Allowed {
			if refusal.Reason == "" {
				refusal.Reason, refusal.Rule, refusal.Addr = string(dec.Reason), ruleString(dec.Rule), a
			}
			continue
		}
		if d.Guard.Refuses(m, a, port) {
			if refusal.Reason == "" {
				refusal.Reason, refusal.Addr = ReasonInternalAddress, a
			}
			continue
		}
		if !v.Allowed {
			v.Allowed, v.Reason, v.Rule, v.Addr = true, string(dec.Reason), ruleString(dec.Rule), a
		}
		v.Addrs = append(v.Addrs, a)
		if len(v.Addrs) == maxDialAddrs {
			break
		}
	}
	if !v.Allowed {
		v.Reason, v.Rule, v.Addr = refusal.Reason, refusal.Rule, refusal.Addr
	}
	return v
}

// lookUp resolves v.Host, a name, once rs could allow it, and returns its addresses,
// unmapped, or the reason it is refused; v gets the canonical name, and the rule of a
// refusal by name.
func (d *Decider) lookUp(ctx context.Context, rs *RuleSet, v *Verdict) ([]netip.Addr, string) {
	host, port, m := v.Host, v.Port, rs.Matcher
	if policy.IsNonCanonicalIPv4(host) {
		return nil, ReasonNonCanonicalIP
	}
	name, err := policy.CanonicalHostname(host)
	if err != nil {
		return nil, ReasonInvalidHost
	}
	v.Name = name
	// Refuse before resolving whatever no address could make allowed, so a refused
	// name never reaches a resolver (no lookups to exfiltrate through): in an
	// allowlist, a name no host rule allows resolves only when an address rule
	// covers the requested port.
	pre := m.Decide(name, netip.Addr{}, port)
	switch m.Mode() {
	case policy.ModeNoNetwork:
		return nil, string(pre.Reason)
	case policy.ModeAllowlist:
		if !pre.Allowed && !rs.addrPorts.covers(port) {
			v.Rule = ruleString(pre.Rule)
			return nil, string(pre.Reason)
		}
	case policy.ModeDenylist:
		if !pre.Allowed {
			v.Rule = ruleString(pre.Rule)
			return nil, string(pre.Reason)
		}
	}
	addrs, err := d.Resolver.LookupNetIP(ctx, name)
	if errors.Is(err, dnsupstream.ErrPolicyChanged) { // a swap stopped the lookup
		return nil, ReasonPolicyChanged
	}
	if err != nil || len(addrs) == 0 {
		return nil, ReasonResolveFailed
	}
	candidates := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		candidates[i] = a.Unmap()
	}
	return candidates, ""
}

// Recheck re-decides an established connection to (name, addr, port) under rs, with no
// lookup: the address is the one actually dialled.
func (d *Decider) Recheck(rs *RuleSet, name string, addr netip.Addr, port uint16) bool {
	m := rs.Matcher
	addr = addr.Unmap()
	return m.Decide(name, addr, port).Allowed && !d.Guard.Refuses(m, addr, port)
}

func ruleString(t policy.Target) string {
	if t.Kind == 0 {
		return ""
	}
	return t.String()
}

// sameAuthority reports whether a Host field names the destination of the URI
// authority uri: the same canonical name or address and, when the field has a port,
// the same port (the URI's defaulting to the scheme's). A field without a port is
// read as the URI's port: clients that leave out a non-default port are common, and
// the host is what the field could lie about.
func sameAuthority(field, uri string, defaultPort uint16) bool {
	uh, up, ureason := splitAuthority(uri, defaultPort)
	fh, fp, freason := splitAuthority(field, up)
	if freason != "" || ureason != "" || fp != up {
		return false
	}
	if fa, err := netip.ParseAddr(fh); err == nil {
		ua, err := netip.ParseAddr(uh)
		return err == nil && fa.Unmap() == ua.Unmap()
	}
	fn, ferr := policy.CanonicalHostname(fh)
	un, uerr := policy.CanonicalHostname(uh)
	return ferr == nil && uerr == nil && fn == un
}
