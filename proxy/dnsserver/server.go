// Package dnsserver is the sandbox's DNS server: it answers each query under the rule
// set in force, forwarding what the policy allows to the upstream resolvers (and
// filtering their answer's addresses), and refusing the rest with Extended DNS Error 15
// (Blocked). README.md says how it decides.
package dnsserver

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/policy"
)

// RuleSet is one generation of policy as the server sees it. Two are the same rule set
// when they compare equal (the sidecar's are pointers); the one that decided a query
// comes back in its Outcome.
type RuleSet interface {
	PolicyMatcher() *policy.Matcher
}

// Exchanger sends a query to the upstream resolvers (dnsupstream.Upstreams).
type Exchanger interface {
	Exchange(ctx context.Context, q *dns.Msg, proceed func() error) (*dns.Msg, error)
}

// Config is what the server needs of the sidecar it answers for.
type Config struct {
	Upstreams Exchanger
	// UpstreamCount is how many upstreams Upstreams asks in turn.
	UpstreamCount int
	// Timeout bounds a client's read or write, and one try of one upstream.
	Timeout time.Duration
	// MaxInflight bounds the queries being answered at once; one more gets SERVFAIL.
	MaxInflight int
	// Current is the rule set in force.
	Current func() RuleSet
	// Decided writes a query's decision line and counts a refusal in its rule set.
	Decided func(Outcome)
	// Malformed logs a message the DNS library could not parse.
	Malformed func(err error)
	// Recovered logs and counts a panic of one query, from client.
	Recovered func(client string, p any)
	// Answered, when not nil, learns the addresses of each allowed answer to client for
	// name (the question's), as it is sent (after truncation), with the smallest TTL
	// among them: a transparent connection to one of them is decided on the name (see
	// proxy/fqdncache). It learns before the answer leaves: a client that connects the
	// moment it has the answer must find the name known. (An allowed answer that then
	// fails to go out leaves the client a name it may ask for again.)
	Answered func(client netip.Addr, name string, addrs []netip.Addr, ttl time.Duration)
	Log      *slog.Logger
	Metrics  Metrics
}

// Server answers the sandbox's queries; it is a dns.Handler.
type Server struct {
	cfg   Config
	slots chan struct{} // one per query being answered
}

// New builds a server; DNSServer gives it a socket.
func New(cfg Config) *Server {
	return &Server{cfg: cfg, slots: make(chan struct{}, cfg.MaxInflight)}
}

// MaxUDPQuery is the longest UDP query read whole: the library's default is 512 bytes,
// which cuts a query with EDNS padding (RFC 8467) or cookies.
const MaxUDPQuery = 4096

// DNSServer is a miekg/dns server answering through s, with its bounds; the caller sets
// its socket (PacketConn or Listener, and Net).
func (s *Server) DNSServer() *dns.Server {
	return &dns.Server{Handler: s, ReadTimeout: s.cfg.Timeout, WriteTimeout: s.cfg.Timeout,
		MsgAcceptFunc: accept, MsgInvalidFunc: s.invalid, UDPSize: MaxUDPQuery}
}

// Inflight is how many queries are being answered now.
func (s *Server) Inflight() int { return len(s.slots) }

// ServeDNS answers the sandbox's queries: forward what the policy allows, refuse the
// rest with Extended DNS Error 15 (Blocked).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	// miekg/dns does not recover a handler's panic, which would end the process: the
	// sandbox's DNS and every connection with it. As CoreDNS does, a panic ends this
	// query alone.
	var client string
	wrote := false // a write was attempted: its message may be out, whole or in part
	defer func() {
		if p := recover(); p != nil {
			s.cfg.Recovered(client, p)
			endPanicked(w, req, wrote)
		}
	}()
	client = w.RemoteAddr().String()
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		// Full: shed at once rather than pile up goroutines waiting for upstreams.
		// Not logged (a flood would flood the log), counted.
		s.cfg.Metrics.Overloaded.WithLabelValues(protocolLabel(udp)).Inc()
		wrote = true
		_ = w.WriteMsg(refusal(req, dns.RcodeServerFailure, ReasonOverloaded))
		return
	}
	o := s.answer(s.cfg.Current(), req)
	o.Client = client
	fit(o.resp, req, udp)
	if o.Decision == "allowed" && s.cfg.Answered != nil {
		s.learn(w.RemoteAddr(), o)
	}
	s.send(w, req, &o, &wrote)
	s.cfg.Metrics.Queries.WithLabelValues(o.Decision, typeLabel(o.Qtype)).Inc()
	s.cfg.Decided(o)
}

// fit readies resp, the answer to req, for the wire: compressed, and cut to the
// client's UDP size.
func fit(resp, req *dns.Msg, udp bool) {
	// An upstream's answer arrives compressed and unpacks without compression: packed
	// as it came, an answer under 64 KiB could outgrow a TCP message.
	resp.Compress = true
	if udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		resp.Truncate(size)
	}
}

// send writes o's answer. An answer that cannot be sent turns o into a refusal
// (SERVFAIL).
func (s *Server) send(w dns.ResponseWriter, req *dns.Msg, o *Outcome, wrote *bool) {
	var netErr net.Error
	err := writeMsg(w, o.resp, wrote)
	if err != nil && o.Decision == "allowed" && !errors.As(err, &netErr) {
		// Not even compressed does it fit: the client gets SERVFAIL, not silence. (A
		// network error is a TCP client that left: its query was still allowed.)
		s.cfg.Log.Warn("dns answer not sent", "name", o.Name, "error", err.Error())
		o.Decision, o.Reason = "denied", ReasonUpstreamFailed
		_ = w.WriteMsg(refusal(req, dns.RcodeServerFailure, ReasonUpstreamFailed))
	}
}

// learn hands the addresses of o's answer, as sent (after truncation), to Answered.
func (s *Server) learn(from net.Addr, o Outcome) {
	ap, err := netip.ParseAddrPort(from.String())
	if err != nil {
		return
	}
	var addrs []netip.Addr
	ttl := uint32(math.MaxUint32)
	for _, rr := range o.resp.Answer {
		var a netip.Addr
		switch r := rr.(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(r.A.To4())
		case *dns.AAAA:
			a, _ = netip.AddrFromSlice(r.AAAA)
		default:
			continue
		}
		if a.IsValid() {
			addrs = append(addrs, a.Unmap())
			ttl = min(ttl, rr.Header().Ttl)
		}
	}
	if len(addrs) > 0 {
		s.cfg.Answered(ap.Addr().Unmap(), o.Name, addrs, time.Duration(ttl)*time.Second)
	}
}

// writeMsg is w.WriteMsg (the proxy signs nothing: no TSIG) with the packing apart,
// so that wrote says whether a write began: a panic while an upstream's answer is
// packed leaves the query to be answered SERVFAIL.
func writeMsg(w dns.ResponseWriter, m *dns.Msg, wrote *bool) error {
	data, err := m.Pack()
	if err != nil {
		return err
	}
	*wrote = true
	_, err = w.Write(data)
	return err
}

// endPanicked ends a query whose answering panicked: SERVFAIL if nothing was written
// yet; else nothing more, and a TCP connection closes, since a message cut short would
// make the client read the stream's next bytes as an answer. A panic of this last
// write, or of the close, ends the query silently: it is the writer's own.
func endPanicked(w dns.ResponseWriter, req *dns.Msg, wrote bool) {
	defer func() { _ = recover() }()
	if !wrote && req != nil {
		_ = w.WriteMsg(refusal(req, dns.RcodeServerFailure, ReasonInternalError))
		return
	}
	_ = w.Close() // for UDP, nothing: the socket is the server's
}

// accept hands every message but a response to ServeDNS, which refuses what it does
// not serve (no single question, a class other than IN, an opcode other than QUERY)
// with REFUSED and, for an EDNS client, Extended DNS Error 15, as for any refusal. The
// library's default would answer those itself with FORMERR or NOTIMP. A response is
// dropped: answering one could start a loop.
func accept(h dns.Header) dns.MsgAcceptAction {
	const qr = 1 << 15
	if h.Bits&qr != 0 {
		return dns.MsgIgnore
	}
	return dns.MsgAccept
}

// invalid counts and logs a message the DNS library could not parse. The library
// answers it itself, before ServeDNS: FORMERR (RFC 1035's answer to a query the server
// cannot interpret; nothing goes upstream) if its header could be read, else nothing.
// The library does not say who sent it.
func (s *Server) invalid(_ []byte, err error) {
	s.cfg.Metrics.Queries.WithLabelValues("denied", "other").Inc()
	s.cfg.Malformed(err)
}
