package dnsserver

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// answerExchanger answers every query with records.
type answerExchanger struct{ records []string }

func (e answerExchanger) Exchange(_ context.Context, q *dns.Msg, proceed func() error) (*dns.Msg, error) {
	if err := proceed(); err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	m.SetReply(q)
	for _, r := range e.records {
		rr, err := dns.NewRR(r)
		if err != nil {
			return nil, err
		}
		m.Answer = append(m.Answer, rr)
	}
	return m, nil
}

// failingWriter is a client whose answer cannot be written.
// learnedFirst records whether the answer had been learned when it was written.
type learnedFirst struct {
	recorder
	learned      *bool
	learnedFirst bool
}

func (w *learnedFirst) Write(b []byte) (int, error) {
	w.learnedFirst = *w.learned
	return w.recorder.Write(b)
}

type learned struct {
	client netip.Addr
	name   string
	addrs  []netip.Addr
	ttl    time.Duration
}

// Answered learns the addresses of an allowed answer sent to its client, with the
// smallest TTL among them, and nothing of a refused query.
func TestAnsweredLearnsWhatWasSent(t *testing.T) {
	records := []string{"a.test. 300 IN CNAME b.test.", "b.test. 60 IN A 10.9.9.9", "b.test. 30 IN A 10.9.9.8"}
	for _, tc := range []struct {
		name   string
		policy string
		w      dns.ResponseWriter
		want   []learned
	}{
		{name: "allowed and sent", policy: `"public"`, w: &recorder{}, want: []learned{{
			client: netip.MustParseAddr("127.0.0.1"), name: "a.test",
			addrs: []netip.Addr{netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("10.9.9.8")}, ttl: 30 * time.Second}}},
		{name: "refused", policy: `"no-network"`, w: &recorder{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := compile(t, tc.policy)
			var got []learned
			s := New(Config{Upstreams: answerExchanger{records}, UpstreamCount: 1, Timeout: dnsTimeout, MaxInflight: 1,
				Current: func() RuleSet { return rs }, Decided: func(Outcome) {},
				Answered: func(client netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) {
					got = append(got, learned{client, name, addrs, ttl})
				},
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics()})
			s.ServeDNS(tc.w, new(dns.Msg).SetQuestion("a.test.", dns.TypeA))
			if !slices.EqualFunc(got, tc.want, func(a, b learned) bool {
				return a.client == b.client && a.name == b.name && slices.Equal(a.addrs, b.addrs) && a.ttl == b.ttl
			}) {
				t.Fatalf("learned %+v, want %+v", got, tc.want)
			}
		})
	}
}

// An answer is learned before it is written: a client that connects to an address the
// moment the answer arrives finds its name known.
func TestAnsweredLearnsBeforeTheAnswerLeaves(t *testing.T) {
	rs := compile(t, `"public"`)
	var learned bool
	w := &learnedFirst{learned: &learned}
	s := New(Config{Upstreams: answerExchanger{[]string{"a.test. 60 IN A 10.9.9.9"}}, UpstreamCount: 1, Timeout: dnsTimeout, MaxInflight: 1,
		Current: func() RuleSet { return rs }, Decided: func(Outcome) {},
		Answered: func(netip.Addr, string, []netip.Addr, time.Duration) { learned = true },
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics()})
	s.ServeDNS(w, new(dns.Msg).SetQuestion("a.test.", dns.TypeA))
	if w.msg == nil || !w.learnedFirst {
		t.Fatalf("answer written %v, learned before it was written %v", w.msg != nil, w.learnedFirst)
	}
}
