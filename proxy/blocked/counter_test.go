package blocked

import (
	"fmt"
	"runtime"
	"strings"
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
	b := New()
	for i := range Capacity {
		name := fmt.Sprintf("n%d.noise.test", i)
		b.Add(Key{name, 0, "dns", string(policy.ReasonNoNetwork), ""})
		b.Add(Key{name, 0, "dns", string(policy.ReasonNoNetwork), ""})
	}
	const tries = 200
	for i := range tries {
		b.Add(Key{"exfil.test", 0, "dns", string(policy.ReasonNoNetwork), ""})
		b.Add(Key{fmt.Sprintf("r%d.noise.test", i), 0, "dns", string(policy.ReasonNoNetwork), ""})
	}
	s := b.Summary(1)
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
	if s.Total != 2*Capacity+2*tries {
		t.Fatalf("total %d", s.Total)
	}
}

// Below the capacity, counts are exact.
func TestBlockedCountsExactlyWhileNotFull(t *testing.T) {
	b := New()
	for i := range 10 {
		for range i + 1 {
			b.Add(Key{fmt.Sprintf("h%d.test", i), 443, "connect", string(policy.ReasonNotAllowlisted), ""})
		}
	}
	s := b.Summary(1)
	for i := range 10 {
		e, ok := findBlocked(s, fmt.Sprintf("h%d.test", i))
		if !ok || e.Count != uint64(i+1) || e.Overcount != 0 {
			t.Fatalf("h%d.test: %+v", i, e)
		}
	}
}

// The report lists the most tried first and breaks ties by host, port, type and reason,
// so that two reads of the same counts agree; it lists at most Top destinations.
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
		{"count first", []try{{"a.test", 443, "connect", deny, 1}, {"b.test", 443, "connect", deny, 2}},
			[]string{"b.test:443/connect/not-allowlisted:2", "a.test:443/connect/not-allowlisted:1"}},
		{"then host", []try{{"b.test", 443, "connect", deny, 1}, {"a.test", 443, "connect", deny, 1}},
			[]string{"a.test:443/connect/not-allowlisted:1", "b.test:443/connect/not-allowlisted:1"}},
		{"then port", []try{{"a.test", 443, "connect", deny, 1}, {"a.test", 80, "connect", deny, 1}},
			[]string{"a.test:80/connect/not-allowlisted:1", "a.test:443/connect/not-allowlisted:1"}},
		{"then type", []try{{"a.test", 443, "http", deny, 1}, {"a.test", 443, "connect", deny, 1}},
			[]string{"a.test:443/connect/not-allowlisted:1", "a.test:443/http/not-allowlisted:1"}},
		{"then reason", []try{{"a.test", 443, "connect", deny, 1}, {"a.test", 443, "connect", none, 1}},
			[]string{"a.test:443/connect/no-network:1", "a.test:443/connect/not-allowlisted:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New()
			for _, tr := range tc.tries {
				for range tr.n {
					b.Add(Key{tr.host, tr.port, tr.typ, tr.reason, ""})
				}
			}
			var got []string
			for _, e := range b.Summary(1).Top {
				got = append(got, fmt.Sprintf("%s:%d/%s/%s:%d", e.Host, e.Port, e.Type, e.Reason, e.Count))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("top %v, want %v", got, tc.want)
			}
		})
	}
	b := New()
	for i := range Top + 1 {
		b.Add(Key{fmt.Sprintf("h%d.test", i), 443, "connect", deny, ""})
	}
	if s := b.Summary(1); len(s.Top) != Top || s.Total != Top+1 {
		t.Errorf("%d listed of total %d, want %d of %d", len(s.Top), s.Total, Top, Top+1)
	}
}

// A destination counted up while the table is full is not the next one to make room:
// the least-counted entry is, whichever that is after the increments.
func TestBlockedEvictsTheLeastCounted(t *testing.T) {
	deny := string(policy.ReasonNotAllowlisted)
	for _, first := range []int{0, Capacity / 2, Capacity - 1} {
		b := New()
		for i := range Capacity {
			b.Add(Key{fmt.Sprintf("k%d.test", i), 443, "connect", deny, ""})
		}
		hot := fmt.Sprintf("k%d.test", first)
		for range 4 {
			b.Add(Key{hot, 443, "connect", deny, ""})
		}
		b.Add(Key{"new.test", 443, "connect", deny, ""})
		if e, ok := findBlocked(b.Summary(1), hot); !ok || e.Count != 5 || e.Overcount != 0 {
			t.Errorf("%s, tried 5 times: %+v (reported %v), want count 5", hot, e, ok)
		}
	}
}

// TestCounterDoesNotPinRequestLines: a refused host is usually a substring of the
// request line it came in (net/url and CanonicalHostname return substrings), which may
// be 64 KiB long. The table of blocked attempts keeps 1024 hosts of at most 255 bytes;
// it must not keep each one's whole request line alive with it.
func TestCounterDoesNotPinRequestLines(t *testing.T) {
	const lineSize = 64 << 10
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b := New()
	for i := range Capacity {
		line := fmt.Sprintf("h%d.test", i) + "/" + strings.Repeat("x", lineSize)
		host := line[:strings.IndexByte(line, '/')]
		b.Add(Key{Host: host, Port: 80, Type: "http", Reason: string(policy.ReasonNotAllowlisted)})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(b)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grew > 8<<20 {
		t.Fatalf("%d blocked hosts keep %d MiB of heap alive (their request lines), want well under 8 MiB", Capacity, grew>>20)
	}
}

// Many distinct destinations keep at most Capacity entries; the summary lists Top of
// them and counts every refusal.
func TestCounterIsBounded(t *testing.T) {
	b := New()
	for i := range Capacity + 100 {
		b.Add(Key{Host: fmt.Sprintf("h%d.test", i), Port: 443, Type: "connect", Reason: "x"})
	}
	if n := len(b.byKey); n > Capacity {
		t.Fatalf("blocked map holds %d entries", n)
	}
	if s := b.Summary(1); len(s.Top) != Top || s.Total != Capacity+100 {
		t.Fatalf("summary: %d top, total %d", len(s.Top), s.Total)
	}
}
