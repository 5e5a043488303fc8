package policy

import (
	"hash/maphash"
	"math/bits"
	"strings"
)

// hostSet finds the rules of exact host names and of wildcard suffixes.
type hostSet struct {
	exact  nameTable // keyed by Host of KindHost rules
	suffix nameTable // keyed by Host (the part after "*.") of KindWildcard rules

	// suffixLabels has bit n set when some wildcard suffix has n labels, so the walk
	// over a long name looks up only suffixes that could exist. Suffixes of 256 labels
	// or more (longer than any valid name) are always looked up.
	suffixLabels [4]uint64
}

func newHostSet(targets []Target, seed maphash.Seed) hostSet {
	s := hostSet{exact: newNameTable(targets, KindHost, seed), suffix: newNameTable(targets, KindWildcard, seed)}
	for _, t := range targets {
		if n := strings.Count(t.Host, ".") + 1; t.Kind == KindWildcard && n < 256 {
			s.suffixLabels[n/64] |= 1 << (n % 64)
		}
	}
	return s
}

// lookup returns the host or wildcard rule that decides name on port, or -1. An exact
// name wins over a wildcard, and a longer wildcard suffix over a shorter one.
func (s *hostSet) lookup(targets []Target, name string, port uint16, allowlist bool) int {
	if name == "" {
		return -1
	}
	if r := s.exact.lookup(targets, name, port, allowlist); r >= 0 {
		return r
	}
	if s.suffix.empty() {
		return -1
	}
	// Walk the suffixes after each dot, longest first. A wildcard needs at least one
	// character in front of its suffix, so a dot at position 0 starts no candidate.
	for i, dots := 1, strings.Count(name[1:], "."); dots > 0; dots-- {
		i += strings.IndexByte(name[i:], '.') + 1
		// name[i:] is a suffix of as many labels as there were dots left.
		if dots < 256 && s.suffixLabels[dots/64]&(1<<(dots%64)) == 0 {
			continue
		}
		if r := s.suffix.lookup(targets, name[i:], port, allowlist); r >= 0 {
			return r
		}
	}
	return -1
}

// nameTable is an open-addressing hash table from a name to the rules written for it.
// A slot holds the name (sharing the policy's bytes), 32 bits of its hash and a
// ruleRef. The tag settles most mismatches without reading the name's bytes, and on a
// hit the bytes and the rule's Target are read independently of each other. At most
// half of the slots are used.
type nameTable struct {
	seed   maphash.Seed
	slots  []nameSlot // a power of two of them; ref 0 marks an empty slot
	rules  ruleGroups // the groups of names with several rules
	hasKey bool

	// filter is a Bloom filter of the names (see filterBits): most names that are not
	// in the table are turned away by a read of this small array, which stays in the
	// cache, instead of a read of the large slots.
	filter []uint64
}

type nameSlot struct {
	name string
	tag  uint32 // the high half of the name's hash
	ref  ruleRef
}

func newNameTable(targets []Target, kind Kind, seed maphash.Seed) nameTable {
	keys := 0
	for _, t := range targets {
		if t.Kind == kind {
			keys++
		}
	}
	tab := nameTable{
		seed:   seed,
		slots:  make([]nameSlot, 1<<bits.Len(uint(2*keys))),
		filter: make([]uint64, 1<<bits.Len(uint(keys/4))),
	}
	// While building, a slot's ref is the key's number plus one.
	items := make([]groupItem, 0, keys)
	n := 0
	for i, t := range targets {
		if t.Kind != kind {
			continue
		}
		sl := tab.slot(t.Host)
		if sl.ref == 0 {
			word, mask := tab.filterBits(maphash.String(seed, t.Host))
			tab.filter[word] |= mask
			n++
			sl.name, sl.ref = t.Host, ruleRef(n)
		}
		items = append(items, groupItem{group: uint32(sl.ref - 1), port: t.Port, rule: uint32(i)})
	}
	var refs []ruleRef
	tab.rules, refs = groupRules(n, items)
	for i, sl := range tab.slots {
		if sl.ref != 0 {
			tab.slots[i].ref = refs[sl.ref-1]
		}
	}
	tab.hasKey = n > 0
	return tab
}

func (tab *nameTable) empty() bool { return !tab.hasKey }

// slot returns the slot holding name, or the empty slot where it goes (its tag set).
func (tab *nameTable) slot(name string) *nameSlot {
	h := maphash.String(tab.seed, name)
	tag, mask := uint32(h>>32), uint64(len(tab.slots)-1)
	for i := h & mask; ; i = (i + 1) & mask {
		sl := &tab.slots[i]
		if sl.ref == 0 {
			sl.tag = tag
			return sl
		}
		if sl.tag == tag && sl.name == name {
			return sl
		}
	}
}

// filterBits returns the filter word of a name's hash h and the two bits it sets
// there. With 16 to 32 filter bits per name, about 1 to 3 in 100 absent names pass.
func (tab *nameTable) filterBits(h uint64) (int, uint64) {
	// The slot index takes h's low bits; remix so that the filter's bits are others.
	f := h * 0x9e3779b97f4a7c15
	word := int(f>>32) & (len(tab.filter) - 1)
	return word, 1<<(f>>52&63) | 1<<(f>>58)
}

// lookup returns the rule for name that decides port, or -1.
func (tab *nameTable) lookup(targets []Target, name string, port uint16, allowlist bool) int {
	if !tab.hasKey {
		return -1
	}
	h := maphash.String(tab.seed, name)
	if word, bits := tab.filterBits(h); tab.filter[word]&bits != bits {
		return -1
	}
	tag, mask := uint32(h>>32), uint64(len(tab.slots)-1)
	for i := h & mask; ; i = (i + 1) & mask {
		sl := &tab.slots[i]
		if sl.ref == 0 {
			return -1
		}
		if sl.tag == tag && sl.name == name {
			return tab.rules.pickRef(sl.ref, targets, port, allowlist)
		}
	}
}
