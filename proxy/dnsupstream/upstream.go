// Package dnsupstream talks to the operator's upstream resolvers: Upstreams sends one
// query with fail-over, UpstreamResolver looks names up for the proxy's own decisions
// (cached, one query per name in flight).
package dnsupstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Upstreams forwards DNS queries to the operator's resolvers: each in turn until one
// answers, over UDP first and again over TCP when the UDP answer is truncated. Every
// query leaves with a fresh ID, so a sandbox cannot choose the IDs our upstream sees.
type Upstreams struct {
	servers []string
	udp     *dns.Client
	tcp     *dns.Client
}

// NewUpstreams builds a forwarder over servers ("host:port") with a per-try timeout.
func NewUpstreams(servers []string, timeout time.Duration) *Upstreams {
	return &Upstreams{
		servers: servers,
		udp:     &dns.Client{Net: "udp", Timeout: timeout, UDPSize: dns.DefaultMsgSize},
		tcp:     &dns.Client{Net: "tcp", Timeout: timeout},
	}
}

// exchange is dns.Client.ExchangeContext, which obeys the context's deadline only,
// made to end when the context is cancelled too (a drain, a resolver closed).
func exchange(ctx context.Context, c *dns.Client, m *dns.Msg, server string) (*dns.Msg, error) {
	co, err := c.DialContext(ctx, server)
	if err != nil {
		return nil, err
	}
	defer co.Close()
	stop := context.AfterFunc(ctx, func() { co.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, co)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return resp, err
}

// Exchange sends q's one question (q itself is not modified and never leaves: see
// upstreamQuery) and returns the first usable answer, with q's ID and question. proceed,
// when not nil, is asked before every send; its error stops the exchange.
func (u *Upstreams) Exchange(ctx context.Context, q *dns.Msg, proceed func() error) (*dns.Msg, error) {
	if len(u.servers) == 0 {
		return nil, errors.New("proxy: no DNS upstream configured")
	}
	if len(q.Question) != 1 {
		return nil, errors.New("proxy: dns upstream: a query needs exactly one question")
	}
	out := upstreamQuery(q)
	var lastErr error
	for i, server := range u.servers {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("proxy: dns upstream: %w", err)
		}
		// Each server gets its share of what is left, so a silent first server cannot
		// use up the whole budget (its retry included) before the second is asked.
		sctx, cancel := serverBudget(ctx, len(u.servers)-i)
		send := func(c *dns.Client) (*dns.Msg, error) {
			if proceed != nil {
				if err := proceed(); err != nil {
					return nil, err
				}
			}
			out.Id = dns.Id()
			return exchange(sctx, c, out, server)
		}
		resp, err := send(u.udp)
		if isTimeout(err) && sctx.Err() == nil {
			// One lost datagram should not fail a decision: ask once more.
			resp, err = send(u.udp)
		}
		if err == nil && resp.Truncated {
			resp, err = send(u.tcp)
		}
		cancel()
		if errors.Is(err, ErrPolicyChanged) {
			return nil, err
		}
		if err != nil {
			lastErr = err
			continue
		}
		if serverFailed(resp.Rcode) {
			lastErr = fmt.Errorf("%s answered %s", server, dns.RcodeToString[resp.Rcode])
			continue
		}
		if !answers(resp, out) {
			// RFC 5452 §9.1: an answer to another question is not this one's.
			lastErr = fmt.Errorf("%s answered another question than the one asked", server)
			continue
		}
		resp.Id = q.Id
		resp.Question = q.Question
		return resp, nil
	}
	return nil, fmt.Errorf("proxy: dns upstream: %w", lastErr)
}

// serverFailed reports whether rcode is a failure of the server rather than an answer
// about the name, so the next server is asked. The query is the proxy's own and well
// formed: FORMERR and NOTIMP to it say as little about the name as SERVFAIL or REFUSED.
func serverFailed(rcode int) bool {
	switch rcode {
	case dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeFormatError, dns.RcodeNotImplemented:
		return true
	}
	return false
}

// answers reports whether resp is a response to q's one question.
func answers(resp, q *dns.Msg) bool {
	if !resp.Response || resp.Opcode != q.Opcode || len(resp.Question) != 1 {
		return false
	}
	a, b := resp.Question[0], q.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}

// upstreamUDPSize is the EDNS0 UDP size the proxy advertises upstream (DNS flag day 2020).
const upstreamUDPSize = 1232

// upstreamQuery builds the query the proxy sends for q: q's one question (name in lower
// case), RD and CD, and the proxy's own EDNS0 OPT with DO only if the client set it.
// Nothing else of the client's message leaves: no other sections, no EDNS options (ECS,
// cookies, private codes), no header bits; the ID is set per try by the caller.
func upstreamQuery(q *dns.Msg) *dns.Msg {
	out := new(dns.Msg)
	out.Opcode = dns.OpcodeQuery
	out.RecursionDesired = q.RecursionDesired
	out.CheckingDisabled = q.CheckingDisabled
	question := q.Question[0]
	question.Name = strings.ToLower(question.Name)
	out.Question = []dns.Question{question}
	do := false
	if opt := q.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	out.SetEdns0(upstreamUDPSize, do)
	return out
}

// serverBudget bounds one server's exchange to an equal share of ctx's remaining time
// among the servers not yet asked (left counts this one).
func serverBudget(ctx context.Context, left int) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || left <= 1 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(deadline)/time.Duration(left))
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// ErrPolicyChanged stops what a newer rule set refuses: an upstream exchange (or a
// shared lookup) of a name, or a dial whose every address is refused.
var ErrPolicyChanged = errors.New("proxy: the policy changed and refuses the name")

// UpstreamResolver resolves through Upstreams: the same resolvers the sandbox's DNS
// answers come from, so a name means the same thing to both. Answers are cached for
// their TTL (bounded) and concurrent lookups of one name share one query: a burst of
// CONNECTs to one host costs one lookup, not one each.
type UpstreamResolver struct {
	upstreams *Upstreams
	// Admit, when set, is asked before every query a lookup sends: a lookup shared by
	// decisions made under an earlier rule set sends nothing more once the rule set in
	// force refuses the name. Set it, and Panicked, before the first lookup.
	Admit func(name string) bool
	// Panicked, when set, logs and counts a panic a lookup recovered from.
	Panicked func(p any)
	ctx      context.Context // cancelled by Close: ends the lookups in flight
	cancel   context.CancelFunc
	lookups  sync.WaitGroup
	mu       sync.Mutex
	cache    map[string]cachedAnswer
	inflight map[string]*lookup
}

type cachedAnswer struct {
	addrs   []netip.Addr
	expires time.Time
}

type lookup struct {
	done  chan struct{}
	addrs []netip.Addr
	err   error
}

const (
	resolverCacheSize = 4096
	resolverMaxTTL    = 5 * time.Minute
	// resolverMaxCachedAddrs bounds the answers kept: whoever serves a name chooses
	// how many addresses it has (thousands over TCP), and a full cache of such answers
	// would hold hundreds of MiB. A longer answer serves its lookup, uncached.
	resolverMaxCachedAddrs = 64
)

// NewUpstreamResolver builds a caching resolver over u.
func NewUpstreamResolver(u *Upstreams) *UpstreamResolver {
	ctx, cancel := context.WithCancel(context.Background())
	return &UpstreamResolver{upstreams: u, ctx: ctx, cancel: cancel, cache: map[string]cachedAnswer{}, inflight: map[string]*lookup{}}
}

// Close ends the lookups in flight and waits for them; later lookups fail.
func (r *UpstreamResolver) Close() {
	r.cancel()
	r.lookups.Wait()
}

// LookupNetIP returns the addresses of name, IPv4 first.
func (r *UpstreamResolver) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	if c, ok := r.cache[name]; ok && time.Now().Before(c.expires) {
		r.mu.Unlock()
		return c.addrs, nil
	}
	l, ok := r.inflight[name]
	if !ok {
		l = &lookup{done: make(chan struct{})}
		r.inflight[name] = l
		r.lookups.Add(1)
		go r.resolve(name, l)
	}
	r.mu.Unlock()
	select {
	case <-l.done:
		return l.addrs, l.err
	case <-ctx.Done():
		return nil, fmt.Errorf("proxy: resolve %s: %w", name, ctx.Err())
	}
}

// StartAfresh makes the lookups that follow send queries of their own instead of waiting
// on those already in flight, which still answer the decisions waiting on them. A swap
// calls it: the switch that puts a rule set may come with a repaired way out (the
// sidecar reconnected to its egress network), and a decision under the new rule set
// must not inherit the failure of a lookup sent while that way was cut.
func (r *UpstreamResolver) StartAfresh() {
	r.mu.Lock()
	r.inflight = map[string]*lookup{}
	r.mu.Unlock()
}

// Inflight is how many names are being looked up now (StartAfresh forgets the
// lookups it leaves to the decisions already waiting on them).
func (r *UpstreamResolver) Inflight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.inflight)
}

// LookupBudget bounds a decision's lookup: two tries of timeout per upstream, so that
// one lost datagram (Exchange asks a silent upstream once more) does not fail it.
func LookupBudget(timeout time.Duration, upstreams int) time.Duration {
	return timeout * time.Duration(2*max(1, upstreams))
}

// resolve runs one shared lookup with its own deadline (a waiter's cancellation must
// not fail the others).
func (r *UpstreamResolver) resolve(name string, l *lookup) {
	defer r.lookups.Done()
	finished := false
	defer func() {
		if finished {
			return
		}
		// A panic fails the lookup, not the process; and the decisions waiting on it,
		// or on a later lookup of the name, must not wait for it forever.
		r.recovered(recover())
		l.addrs, l.err = nil, ErrLookupPanicked
		r.mu.Lock()
		if r.inflight[name] == l {
			delete(r.inflight, name)
		}
		r.mu.Unlock()
		close(l.done)
	}()
	ctx, cancel := context.WithTimeout(r.ctx, LookupBudget(r.upstreams.udp.Timeout, len(r.upstreams.servers)))
	defer cancel()
	addrs, ttl, err := r.query(ctx, name)
	l.addrs, l.err = addrs, err
	r.mu.Lock()
	if r.inflight[name] == l { // else StartAfresh let a later lookup take its place
		delete(r.inflight, name)
	}
	if err == nil && ttl > 0 && len(addrs) <= resolverMaxCachedAddrs {
		if len(r.cache) >= resolverCacheSize {
			for k := range r.cache { // evict an arbitrary entry
				delete(r.cache, k)
				break
			}
		}
		r.cache[name] = cachedAnswer{addrs: addrs, expires: time.Now().Add(ttl)}
	}
	r.mu.Unlock()
	close(l.done)
	finished = true
}

// ErrLookupPanicked fails a lookup that panicked.
var ErrLookupPanicked = errors.New("proxy: the lookup panicked")

func (r *UpstreamResolver) recovered(p any) {
	if r.Panicked != nil {
		r.Panicked(p)
	}
}

// query asks for A and AAAA records in parallel.
func (r *UpstreamResolver) query(ctx context.Context, name string) ([]netip.Addr, time.Duration, error) {
	fqdn := dns.Fqdn(name)
	var (
		wg      sync.WaitGroup
		results [2][]netip.Addr
		ttls    [2]time.Duration
		errs    [2]error
	)
	for i, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					r.recovered(p)
					errs[i] = ErrLookupPanicked
				}
			}()
			q := new(dns.Msg)
			q.SetQuestion(fqdn, qtype)
			q.RecursionDesired = true
			resp, err := r.upstreams.Exchange(ctx, q, r.proceed(name))
			if err != nil {
				errs[i] = err
				return
			}
			if resp.Rcode != dns.RcodeSuccess {
				errs[i] = fmt.Errorf("proxy: resolve %s: %s", name, dns.RcodeToString[resp.Rcode])
				return
			}
			results[i] = AnswerAddrs(resp)
			ttls[i] = resolverMaxTTL
			for _, rr := range resp.Answer {
				ttls[i] = min(ttls[i], time.Duration(rr.Header().Ttl)*time.Second)
			}
		}()
	}
	wg.Wait()
	addrs := append(results[0], results[1]...)
	if len(addrs) == 0 {
		if err := errors.Join(errs[0], errs[1]); err != nil {
			return nil, 0, err
		}
		return nil, 0, &net.DNSError{Err: "no addresses", Name: name, IsNotFound: true}
	}
	ttl := ttls[0]
	if len(results[1]) > 0 && (len(results[0]) == 0 || ttls[1] < ttl) {
		ttl = ttls[1]
	}
	if errs[0] != nil || errs[1] != nil {
		// Half an answer serves this lookup but is not cached: one lost or failed
		// query would leave the name one address family short for its whole TTL.
		ttl = 0
	}
	return addrs, ttl, nil
}

// proceed is Exchange's check before each send of a lookup of name (nil: none).
func (r *UpstreamResolver) proceed(name string) func() error {
	if r.Admit == nil {
		return nil
	}
	return func() error {
		if !r.Admit(name) {
			return ErrPolicyChanged
		}
		return nil
	}
}

// AnswerAddrs collects the A and AAAA records of an answer section.
func AnswerAddrs(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := RRAddr(rr); ok {
			out = append(out, a)
		}
	}
	return out
}

// RRAddr is the address of an A or AAAA record.
func RRAddr(rr dns.RR) (netip.Addr, bool) {
	switch v := rr.(type) {
	case *dns.A:
		a, ok := netip.AddrFromSlice(v.A.To4())
		return a, ok
	case *dns.AAAA:
		a, ok := netip.AddrFromSlice(v.AAAA.To16())
		return a, ok
	}
	return netip.Addr{}, false
}
