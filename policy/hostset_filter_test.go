package policy

import (
	"hash/maphash"
	"strconv"
	"testing"
)

// TestNameTableFilter checks the name filter that spares most absent names a read of
// the slots: every present name passes it, and few absent names do.
func TestNameTableFilter(t *testing.T) {
	for _, keys := range []int{1, 7, 1000, 100_000} {
		t.Run(strconv.Itoa(keys), func(t *testing.T) {
			targets := make([]Target, keys)
			for i := range targets {
				targets[i] = Target{Kind: KindHost, Host: "h" + strconv.Itoa(i) + ".filter.test"}
			}
			tab := newNameTable(targets, KindHost, maphash.MakeSeed())
			passes := func(name string) bool {
				word, bits := tab.filterBits(maphash.String(tab.seed, name))
				return tab.filter[word]&bits == bits
			}
			for _, tg := range targets {
				if !passes(tg.Host) {
					t.Fatalf("the filter turns away %q, which the table holds", tg.Host)
				}
			}
			const absent = 100_000
			passed := 0
			for i := range absent {
				if passes("a" + strconv.Itoa(i) + ".absent.test") {
					passed++
				}
			}
			rate := float64(passed) / absent
			t.Logf("%d names: %.2f%% of absent names pass", keys, 100*rate)
			if rate > 0.05 {
				t.Errorf("%.1f%% of absent names pass the filter, want at most 5%%", 100*rate)
			}
		})
	}
}
