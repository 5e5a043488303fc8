package proxy

import (
	"fmt"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

func findBlocked(s BlockedSummary, host string) (BlockedTarget, bool) {
	for _, e := range s.Top {
		if e.Host == host {
			return e, true
		}
	}
	return BlockedTarget{}, false
}

// A destination tried over and over stays in the report, however many fresh names a
// sandbox tries in between, and its count is within its overcount of the truth.
func TestBlockedKeepsTheMostTried(t *testing.T) {
	b := newBlockedCounter()
	for i := range blockedCapacity {
		name := fmt.Sprintf("n%d.noise.test", i)
		b.add(name, 0, typeDNS, string(policy.ReasonNoNetwork))
		b.add(name, 0, typeDNS, string(policy.ReasonNoNetwork))
	}
	const tries = 200
	for i := range tries {
		b.add("exfil.test", 0, typeDNS, string(policy.ReasonNoNetwork))
		b.add(fmt.Sprintf("r%d.noise.test", i), 0, typeDNS, string(policy.ReasonNoNetwork))
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
			b.add(fmt.Sprintf("h%d.test", i), 443, typeConnect, string(policy.ReasonNotAllowlisted))
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
