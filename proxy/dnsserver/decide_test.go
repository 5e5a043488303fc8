package dnsserver

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/policy"
)

type fakeRules struct{ m *policy.Matcher }

func (r *fakeRules) PolicyMatcher() *policy.Matcher { return r.m }

func compile(t *testing.T, doc string) *fakeRules {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return &fakeRules{policy.Compile(p)}
}

// decide refuses, forwards or filters by mode, as README.md's table says.
func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name, doc, host string
		qtype           uint16
		refused         bool
		filtered        bool
		keeps           string // an address keep allows, when filtered
		drops           string // an address keep refuses, when filtered
	}{
		{name: "public", doc: `"public"`, host: "a.test", qtype: dns.TypeA},
		{name: "no-network", doc: `"no-network"`, host: "a.test", qtype: dns.TypeA, refused: true},
		{name: "allowlisted name", doc: `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, host: "a.test", qtype: dns.TypeTXT},
		{name: "not allowlisted", doc: `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, host: "b.test", qtype: dns.TypeA, refused: true},
		{name: "address rule, A", doc: `{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`, host: "b.test", qtype: dns.TypeA,
			filtered: true, keeps: "10.9.9.9", drops: "10.9.8.9"},
		{name: "address rule, TXT", doc: `{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`, host: "b.test", qtype: dns.TypeTXT, refused: true},
		{name: "denylisted name", doc: `{"network_mode":"denylist","denied_hosts":["a.test"]}`, host: "a.test", qtype: dns.TypeA, refused: true},
		{name: "denylist, other name", doc: `{"network_mode":"denylist","denied_hosts":["10.9.9.0/24"]}`, host: "b.test", qtype: dns.TypeA,
			filtered: true, keeps: "10.9.8.9", drops: "10.9.9.9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := decide(compile(t, tc.doc).m, tc.host, tc.qtype)
			if r.refused != tc.refused || (r.keep != nil) != tc.filtered {
				t.Fatalf("refused %v, filtered %v; want %v, %v", r.refused, r.keep != nil, tc.refused, tc.filtered)
			}
			if tc.filtered && (!r.keep(netip.MustParseAddr(tc.keeps)) || r.keep(netip.MustParseAddr(tc.drops))) {
				t.Errorf("keep(%s) %v, keep(%s) %v; want true, false", tc.keeps, r.keep(netip.MustParseAddr(tc.keeps)), tc.drops, r.keep(netip.MustParseAddr(tc.drops)))
			}
		})
	}
}

// swapExchanger answers with one A record, after putting next in force: the rule set
// that replaces the one a query was decided under.
type swapExchanger struct {
	current *RuleSet
	next    RuleSet
	sent    int
}

func (e *swapExchanger) Exchange(_ context.Context, q *dns.Msg, proceed func() error) (*dns.Msg, error) {
	*e.current = e.next
	if err := proceed(); err != nil {
		return nil, err
	}
	e.sent++
	m := new(dns.Msg)
	m.SetReply(q)
	rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 10.9.9.9")
	m.Answer = []dns.RR{rr}
	return m, nil
}

// A swap while a query waits for its upstream decides it again under the new rule set,
// through the narrow Config alone: the new one refuses it, nothing is sent, and the
// outcome names the rule set that decided.
func TestAnswerFollowsASwap(t *testing.T) {
	var current RuleSet = compile(t, `"public"`)
	next := compile(t, `"no-network"`)
	ex := &swapExchanger{current: &current, next: next}
	var got []Outcome
	s := New(Config{Upstreams: ex, UpstreamCount: 1, Timeout: dnsTimeout, MaxInflight: 1,
		Current: func() RuleSet { return current }, Decided: func(o Outcome) { got = append(got, o) },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics()})
	w := &recorder{}
	s.ServeDNS(w, new(dns.Msg).SetQuestion("a.test.", dns.TypeA))
	if ex.sent != 0 || w.msg == nil || w.msg.Rcode != dns.RcodeRefused {
		t.Fatalf("sent %d, answer %v; want nothing sent and REFUSED", ex.sent, w.msg)
	}
	if len(got) != 1 || got[0].RuleSet != RuleSet(next) || got[0].Decision != "denied" || got[0].Reason != string(policy.ReasonNoNetwork) {
		t.Fatalf("outcomes %+v, want one denied under the new rule set (no-network)", got)
	}
}

const dnsTimeout = 2 * time.Second

// recorder is a dns.ResponseWriter that keeps the message written.
type recorder struct {
	dns.ResponseWriter
	msg *dns.Msg
}

func (w *recorder) RemoteAddr() net.Addr      { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353} }
func (w *recorder) WriteMsg(m *dns.Msg) error { w.msg = m; return nil }
func (w *recorder) Write(b []byte) (int, error) {
	w.msg = new(dns.Msg)
	return len(b), w.msg.Unpack(b)
}
