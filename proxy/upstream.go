package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
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

// Exchange sends q (which it does not modify) and returns the first usable answer. The
// answer's ID is q's ID.
func (u *Upstreams) Exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	if len(u.servers) == 0 {
		return nil, errors.New("proxy: no DNS upstream configured")
	}
	out := q.Copy()
	var lastErr error
	for _, server := range u.servers {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("proxy: dns upstream: %w", err)
		}
		out.Id = dns.Id()
		resp, _, err := u.udp.ExchangeContext(ctx, out, server)
		if err == nil && resp.Truncated {
			out.Id = dns.Id()
			resp, _, err = u.tcp.ExchangeContext(ctx, out, server)
		}
		if err != nil {
			lastErr = err
			continue
		}
		if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
			lastErr = fmt.Errorf("%s answered %s", server, dns.RcodeToString[resp.Rcode])
			continue
		}
		resp.Id = q.Id
		return resp, nil
	}
	return nil, fmt.Errorf("proxy: dns upstream: %w", lastErr)
}

// Resolver turns a canonical host name into candidate addresses. The proxy resolves a
// name once per decision and dials only an address it checked.
type Resolver interface {
	LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error)
}

// UpstreamResolver resolves through Upstreams: the same resolvers the sandbox's DNS
// answers come from, so a name means the same thing to both.
type UpstreamResolver struct{ Upstreams *Upstreams }

// LookupNetIP asks for A and AAAA records in parallel and returns IPv4 answers first.
func (r UpstreamResolver) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	fqdn := dns.Fqdn(name)
	var (
		wg      sync.WaitGroup
		results [2][]netip.Addr
		errs    [2]error
	)
	for i, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := new(dns.Msg)
			q.SetQuestion(fqdn, qtype)
			q.RecursionDesired = true
			resp, err := r.Upstreams.Exchange(ctx, q)
			if err != nil {
				errs[i] = err
				return
			}
			if resp.Rcode != dns.RcodeSuccess {
				errs[i] = fmt.Errorf("proxy: resolve %s: %s", name, dns.RcodeToString[resp.Rcode])
				return
			}
			results[i] = answerAddrs(resp)
		}()
	}
	wg.Wait()
	addrs := append(results[0], results[1]...)
	if len(addrs) == 0 {
		if err := errors.Join(errs[0], errs[1]); err != nil {
			return nil, err
		}
		return nil, &net.DNSError{Err: "no addresses", Name: name, IsNotFound: true}
	}
	return addrs, nil
}

// answerAddrs collects the A and AAAA records of an answer section.
func answerAddrs(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := rrAddr(rr); ok {
			out = append(out, a)
		}
	}
	return out
}

func rrAddr(rr dns.RR) (netip.Addr, bool) {
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
