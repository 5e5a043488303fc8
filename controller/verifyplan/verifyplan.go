// Package verifyplan plans `env verify`: the probe checks an environment's intended
// policy calls for, each with the outcome that policy expects, and reads the probe's
// results as outcomes. It knows addresses and the policy, not Docker.
//
// Under the transparent path (restricted modes) every TCP connection of the agent is
// accepted by its sidecar and every DNS query to port 53 of any address is answered by
// it, so a check counts the destination's own answer (a body, a banner, a handshake) or
// the sidecar's recognisable refusal, never a mere connect.
package verifyplan

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/compass-egress/compass-egress/images/probe/probespec"
	"github.com/compass-egress/compass-egress/policy"
)

// Outcomes, as the verify table prints them.
const (
	Works      = "works"
	Fails      = "fails"
	Refused    = "refused by the sidecar"
	NotRefused = "let through by the sidecar"
)

// Ports of the sidecar and of the checks.
const (
	ProxyPort = 3128
	DNSPort   = 53
	// UDPPort is where the UDP check sends its datagram: a port nothing should answer
	// on (the first traceroute port), so that direct wiring gets a port-unreachable back.
	UDPPort = 33434
	// DefaultBanner is what a --allowed-tcp/--blocked-tcp destination must send first:
	// the start of an SSH identification string (RFC 4253).
	DefaultBanner = "SSH-"
)

// Targets are what the operator asks verify to check.
type Targets struct {
	Allowed    []string // host:port that must work through the proxy and without it
	Blocked    []string // host:port that must fail through the proxy and without it
	AllowedTCP []string // host:port of a server that speaks first, allowed by name
	BlockedTCP []string // host:port of a server that speaks first, refused
	Banner     string   // the first bytes those servers send; default DefaultBanner
	// Outside is an address outside the sandbox for the checks that name no host (TCP
	// to it, UDP to it, DNS to its port 53); OutsidePort the TCP port (default 80).
	Outside     netip.Addr
	OutsidePort uint16
}

// Addrs are the environment's addresses the checks need.
type Addrs struct {
	Sidecar netip.Addr // the proxy at :3128, DNS at :53
	Gateway netip.Addr // the task network's gateway, on no interface
}

// judge is how a result becomes an outcome.
type judge int

const (
	byReachable  judge = iota // works / fails
	byResolved                // works (an address came back) / fails
	byRefusal                 // refused / works / fails
	byLetThrough              // refused / let through
)

// Check is one planned probe check and the outcome the policy calls for.
type Check struct {
	probespec.Check
	Label, Target, Want string
	judge               judge
}

// Observed is the outcome r shows for c.
func (c Check) Observed(r probespec.Result) string {
	switch {
	case c.judge == byResolved:
		return outcome(r.Resolved)
	case (c.judge == byRefusal || c.judge == byLetThrough) && r.Refused:
		return Refused
	case c.judge == byLetThrough:
		return NotRefused
	}
	return outcome(r.Reachable)
}

func outcome(ok bool) string {
	if ok {
		return Works
	}
	return Fails
}

// DropRow is the row of the transparent path's UDP drop counter, read before and after
// the probe, whose UDP check must have raised it.
func DropRow(before, after uint64, err error) (label, want, observed, detail string) {
	label, want = "UDP drop counted (transparent counters)", "counted"
	switch {
	case err != nil:
		return label, want, "unreadable", err.Error()
	case after > before:
		return label, want, "counted", fmt.Sprintf("udp drops %d -> %d", before, after)
	}
	return label, want, "not counted", fmt.Sprintf("udp drops %d -> %d: the UDP check was not seen dropped", before, after)
}

// Plan is the checks for pol's mode, in table order.
func Plan(pol policy.Policy, a Addrs, t Targets) ([]Check, error) {
	p := planner{pol: pol, m: policy.Compile(pol), a: a, t: t,
		proxy:    netip.AddrPortFrom(a.Sidecar, ProxyPort).String(),
		resolver: netip.AddrPortFrom(a.Sidecar, DNSPort).String()}
	if p.t.Banner == "" {
		p.t.Banner = DefaultBanner
	}
	if p.t.OutsidePort == 0 {
		p.t.OutsidePort = 80
	}
	for _, step := range []func() error{p.named, p.tcpByName, p.unnamed, p.sandboxEdges} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return p.out, nil
}

type planner struct {
	pol             policy.Policy
	m               *policy.Matcher
	a               Addrs
	t               Targets
	proxy, resolver string
	out             []Check
}

func (p *planner) add(label, target, want string, j judge, c probespec.Check) {
	c.Name = strconv.Itoa(len(p.out))
	p.out = append(p.out, Check{Check: c, Label: label, Target: target, Want: want, judge: j})
}

func (p *planner) restricted() bool { return p.pol.Restricted() }

// direct is the label suffix of a check made without the proxy.
func (p *planner) direct() string {
	if p.restricted() {
		return ", no proxy (transparent)"
	}
	return ", no proxy (direct)"
}

// named plans the --allowed and --blocked targets: through the proxy, and as a client
// that ignores it (TLS by server name for port 443, else HTTP by Host).
func (p *planner) named() error {
	for _, t := range p.t.Allowed {
		_, port, err := net.SplitHostPort(t)
		if err != nil {
			return fmt.Errorf("verify: allowed target %q: want host:port", t)
		}
		p.add("allowed via proxy", t, Works, byReachable, probespec.Check{Kind: "proxy", Target: t, Proxy: p.proxy})
		if port == "443" {
			p.add("allowed by TLS name"+p.direct(), t, Works, byReachable, probespec.Check{Kind: "tls", Target: t, Resolver: p.resolver})
		} else {
			p.add("allowed by HTTP Host"+p.direct(), t, Works, byReachable, probespec.Check{Kind: "http", Target: t, Resolver: p.resolver})
		}
	}
	for _, t := range p.t.Blocked {
		host, port, err := net.SplitHostPort(t)
		if err != nil {
			return fmt.Errorf("verify: blocked target %q: want host:port", t)
		}
		p.add("blocked via proxy", t, Fails, byReachable, probespec.Check{Kind: "proxy", Target: t, Proxy: p.proxy})
		if _, err := netip.ParseAddr(host); err != nil {
			p.add("DNS of blocked name", host, Fails, byResolved, probespec.Check{Kind: "dns", Server: p.resolver, QName: host})
		}
		if !p.restricted() {
			continue
		}
		// The agent learns no address for a blocked name: it names it to the outside
		// address, as a client with an address of its own would.
		at := netip.AddrPortFrom(p.t.Outside, mustPort(port)).String()
		if port == "443" {
			p.add("blocked by TLS name, no proxy (transparent; to --outside)", host+" at "+at, Fails, byReachable, probespec.Check{Kind: "tls", Target: at, Host: host})
		} else {
			p.add("blocked by HTTP Host, no proxy (transparent; to --outside)", host+" at "+at, Refused, byRefusal, probespec.Check{Kind: "http", Target: at, Host: host})
		}
	}
	return nil
}

func mustPort(s string) uint16 {
	n, _ := strconv.ParseUint(s, 10, 16)
	return uint16(n)
}

// tcpByName plans the non-HTTP ports: the name resolved through the sidecar, then the
// address dialled directly; the destination must speak first.
func (p *planner) tcpByName() error {
	for _, t := range p.t.AllowedTCP {
		if _, _, err := net.SplitHostPort(t); err != nil {
			return fmt.Errorf("verify: allowed TCP target %q: want host:port", t)
		}
		label := "non-HTTP port by name" + p.direct()
		if p.restricted() {
			label = "non-HTTP port allowed by a DNS-learned name, no proxy (transparent)"
		}
		p.add(label, t, Works, byReachable, probespec.Check{Kind: "tcp", Target: t, Resolver: p.resolver, Expect: p.t.Banner})
	}
	for _, t := range p.t.BlockedTCP {
		if _, _, err := net.SplitHostPort(t); err != nil {
			return fmt.Errorf("verify: blocked TCP target %q: want host:port", t)
		}
		if p.restricted() {
			p.add("non-HTTP port refused, no proxy (transparent; name resolved through the sidecar)", t, Fails, byReachable,
				probespec.Check{Kind: "tcp", Target: t, Resolver: p.resolver, Expect: p.t.Banner})
		}
	}
	return nil
}

// unnamed plans the checks that name no host: TCP, UDP and DNS to the outside address.
func (p *planner) unnamed() error {
	outside := netip.AddrPortFrom(p.t.Outside, p.t.OutsidePort)
	udp := netip.AddrPortFrom(p.t.Outside, UDPPort).String()
	dns := netip.AddrPortFrom(p.t.Outside, DNSPort).String()
	qname := "compass-verify.test"
	for _, t := range p.t.Blocked {
		if host, _, _ := net.SplitHostPort(t); !isAddr(host) {
			qname = host
			break
		}
	}
	if !p.restricted() {
		p.add("direct TCP out", outside.String(), Works, byReachable, probespec.Check{Kind: "tcp", Target: outside.String()})
		p.add("UDP out (direct)", udp, Works, byReachable, probespec.Check{Kind: "dns", Server: udp, QName: qname, TimeoutMS: 1500})
		p.add("DNS to outside resolver (UDP, direct)", dns, Works, byReachable, probespec.Check{Kind: "dns", Server: dns, QName: qname})
		p.add("DNS to outside resolver (TCP, direct)", dns, Works, byReachable, probespec.Check{Kind: "dns", Net: "tcp", Server: dns, QName: qname})
		return nil
	}
	// An HTTP request whose Host is the address is decided on the address alone (IP and
	// CIDR rules), whatever names the sidecar's DNS answered for it.
	want := Refused
	if p.m.Decide("", outside.Addr(), outside.Port()).Allowed {
		want = NotRefused
	}
	p.add("TCP to outside address, no name (transparent: decided on the address)", outside.String(), want, byLetThrough,
		probespec.Check{Kind: "http", Target: outside.String()})
	p.add("UDP to outside address (dropped by the sidecar)", udp, Fails, byReachable, probespec.Check{Kind: "dns", Server: udp, QName: qname, TimeoutMS: 1500})
	want = Refused
	if p.m.Decide(qname, netip.Addr{}, 0).Allowed {
		want = Works
	}
	p.add("DNS to outside resolver (UDP): answered by the sidecar under the policy", dns+" "+qname, want, byRefusal,
		probespec.Check{Kind: "dns", Server: dns, QName: qname})
	p.add("DNS to outside resolver (TCP): answered by the sidecar under the policy", dns+" "+qname, want, byRefusal,
		probespec.Check{Kind: "dns", Net: "tcp", Server: dns, QName: qname})
	return nil
}

func isAddr(host string) bool { _, err := netip.ParseAddr(host); return err == nil }

// sandboxEdges plans what no mode may reach: the host at the task network's gateway
// (on no interface: a refusal counts as reachable, so any port shows it is there) and
// the sidecar's admin API.
func (p *planner) sandboxEdges() error {
	gw := netip.AddrPortFrom(p.a.Gateway, p.t.OutsidePort).String()
	gwDNS := netip.AddrPortFrom(p.a.Gateway, DNSPort).String()
	p.add("host at task network gateway (TCP)", gw, Fails, byReachable, probespec.Check{Kind: "tcp", Target: gw})
	p.add("host at task network gateway (UDP, DNS query)", gwDNS, Fails, byReachable, probespec.Check{Kind: "dns", Server: gwDNS, QName: "compass-verify.test"})
	for _, port := range []uint16{ProxyPort, 9090, 80} {
		t := netip.AddrPortFrom(p.a.Sidecar, port).String()
		p.add("sidecar admin API", t, Fails, byReachable, probespec.Check{Kind: "admin", Target: t})
	}
	return nil
}
