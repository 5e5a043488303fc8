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

// TestNameTableKeepsTagCollisionsApart builds a table of two names that share the
// 32-bit tag and the first slot, and checks that each still finds its own rule: the tag
// only settles mismatches early, the name decides. A name that matched another's rule
// would let an allowlist entry admit a host nobody listed.
func TestNameTableKeepsTagCollisionsApart(t *testing.T) {
	seed := maphash.MakeSeed()
	// Two keys get 8 slots: a collision needs the tag and the low 3 bits of the hash
	// alike, 35 bits, which about 2^18 names give.
	seen := make(map[uint64]string)
	var a, b string
	for i := 0; a == ""; i++ {
		name := "c" + strconv.Itoa(i) + ".collide.test"
		h := maphash.String(seed, name)
		key := h>>32<<3 | h&7
		if other, ok := seen[key]; ok {
			a, b = other, name
		}
		seen[key] = name
	}
	targets := []Target{{Kind: KindHost, Host: a}, {Kind: KindHost, Host: b, Port: 443}}
	s := newHostSet(targets, seed)
	for want, name := range []string{a, b} {
		if got := s.lookup(targets, name, 443, true); got != want {
			t.Errorf("lookup(%q) = rule %d, want %d (%q and %q share a tag and a slot)", name, got, want, a, b)
		}
	}
}
