package proxy

import (
	"fmt"
	"testing"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
)

func findBlocked(s adminapi.BlockedSummary, host string) (adminapi.BlockedTarget, bool) {
	for _, e := range s.Top {
		if e.Host == host {
			return e, true
		}
	}
	return adminapi.BlockedTarget{}, false
}

// A destination tried over and over stays in the report, however many fresh names a
// sandbox tries in between, and its count is within its overcount of the truth.
func TestBlockedKeepsTheMostTried(t *testing.T) {
	b := newBlockedCounter()
	for i := range blockedCapacity {
		name := fmt.Sprintf("n%d.noise.test", i)
		b.add(name, 0, typeDNS, string(policy.ReasonNoNetwork), "")
		b.add(name, 0, typeDNS, string(policy.ReasonNoNetwork), "")
	}
	const tries = 200
	for i := range tries {
		b.add("exfil.test", 0, typeDNS, string(policy.ReasonNoNetwork), "")
		b.add(fmt.Sprintf("r%d.noise.test", i), 0, typeDNS, string(policy.ReasonNoNetwork), "")
	}
	s := b.summary(1)
	e, ok := findBlocked(s, "exfil.test")
	if !ok {
		t.Fatalf("exfil.test, tried %d times, is not reported: %+v", tries, s.Top[:3])
	}
	if e.Count < tries || e.Count-e.Overcount > tries {
		t.Fatalf("exfil.test: count %d, overcount %d; tried %d times", e.Count, e.Overcount, tries)
	}
	if s.Top[0].Host != "exfil.test" {
		t.Fatalf("first reported: %+v, want exfil.test", s.Top[0])
	}
	if s.Total != 2*blockedCapacity+2*tries {
		t.Fatalf("total %d", s.Total)
	}
}

// Below the capacity, counts are exact.
func TestBlockedCountsExactlyWhileNotFull(t *testing.T) {
	b := newBlockedCounter()
	for i := range 10 {
		for range i + 1 {
			b.add(fmt.Sprintf("h%d.test", i), 443, typeConnect, string(policy.ReasonNotAllowlisted), "")
		}
	}
	s := b.summary(1)
	for i := range 10 {
		e, ok := findBlocked(s, fmt.Sprintf("h%d.test", i))
		if !ok || e.Count != uint64(i+1) || e.Overcount != 0 {
			t.Fatalf("h%d.test: %+v", i, e)
		}
	}
}

// The report lists the most tried first and breaks ties by host, port, type and reason,
// so that two reads of the same counts agree; it lists at most blockedTop destinations.
func TestBlockedSummaryOrder(t *testing.T) {
	type try struct {
		host   string
		port   uint16
		typ    string
		reason string
		n      int
	}
	deny, none := string(policy.ReasonNotAllowlisted), string(policy.ReasonNoNetwork)
	for _, tc := range []struct {
		name  string
		tries []try
		want  []string // host:port/type/reason:count, in order
	}{
		{"count first", []try{{"a.test", 443, typeConnect, deny, 1}, {"b.test", 443, typeConnect, deny, 2}},
			[]string{"b.test:443/connect/not-allowlisted:2", "a.test:443/connect/not-allowlisted:1"}},
		{"then host", []try{{"b.test", 443, typeConnect, deny, 1}, {"a.test", 443, typeConnect, deny, 1}},
			[]string{"a.test:443/connect/not-allowlisted:1", "b.test:443/connect/not-allowlisted:1"}},
		{"then port", []try{{"a.test", 443, typeConnect, deny, 1}, {"a.test", 80, typeConnect, deny, 1}},
			[]string{"a.test:80/connect/not-allowlisted:1", "a.test:443/connect/not-allowlisted:1"}},
		{"then type", []try{{"a.test", 443, typeHTTP, deny, 1}, {"a.test", 443, typeConnect, deny, 1}},
			[]string{"a.test:443/connect/not-allowlisted:1", "a.test:443/http/not-allowlisted:1"}},
		{"then reason", []try{{"a.test", 443, typeConnect, deny, 1}, {"a.test", 443, typeConnect, none, 1}},
			[]string{"a.test:443/connect/no-network:1", "a.test:443/connect/not-allowlisted:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBlockedCounter()
			for _, tr := range tc.tries {
				for range tr.n {
					b.add(tr.host, tr.port, tr.typ, tr.reason, "")
				}
			}
			var got []string
			for _, e := range b.summary(1).Top {
				got = append(got, fmt.Sprintf("%s:%d/%s/%s:%d", e.Host, e.Port, e.Type, e.Reason, e.Count))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("top %v, want %v", got, tc.want)
			}
		})
	}
	b := newBlockedCounter()
	for i := range blockedTop + 1 {
		b.add(fmt.Sprintf("h%d.test", i), 443, typeConnect, deny, "")
	}
	if s := b.summary(1); len(s.Top) != blockedTop || s.Total != blockedTop+1 {
		t.Errorf("%d listed of total %d, want %d of %d", len(s.Top), s.Total, blockedTop, blockedTop+1)
	}
}

// A destination counted up while the table is full is not the next one to make room:
// the least-counted entry is, whichever that is after the increments.
func TestBlockedEvictsTheLeastCounted(t *testing.T) {
	deny := string(policy.ReasonNotAllowlisted)
	for _, first := range []int{0, blockedCapacity / 2, blockedCapacity - 1} {
		b := newBlockedCounter()
		for i := range blockedCapacity {
			b.add(fmt.Sprintf("k%d.test", i), 443, typeConnect, deny, "")
		}
		hot := fmt.Sprintf("k%d.test", first)
		for range 4 {
			b.add(hot, 443, typeConnect, deny, "")
		}
		b.add("new.test", 443, typeConnect, deny, "")
		if e, ok := findBlocked(b.summary(1), hot); !ok || e.Count != 5 || e.Overcount != 0 {
			t.Errorf("%s, tried 5 times: %+v (reported %v), want count 5", hot, e, ok)
		}
	}
}
