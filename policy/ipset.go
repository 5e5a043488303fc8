package policy

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"
)

// ipSet finds the IP and CIDR rules covering an address.
//
// Each family's address space is cut into disjoint spans at every prefix boundary;
// each span records the innermost prefix covering it. A lookup finds the span (a radix
// index on the bits where the boundaries differ narrows a binary search to a span or
// two), then walks outwards through the enclosing prefixes (at most one per prefix
// length) until one has a rule for the port. An address rule is the full-length
// prefix of its address.
type ipSet struct {
	v4 family4
	v6 family6 // IPv4-mapped IPv6 addresses included, as IPv6
}

type family4 struct {
	spans []span4 // ascending starts; spans[0].start == 0
	index spanIndex
	nest  prefixNest
}

type span4 struct {
	start uint32
	inner int32   // innermost prefix covering the span, or -1
	ref   ruleRef // the rules of inner, copied here to save a read
}

type family6 struct {
	spans []span6
	index spanIndex
	nest  prefixNest
}

type span6 struct {
	start u128
	inner int32
	ref   ruleRef
}

// spanIndex maps the `bits` address bits after the first `shift` (the bits the span
// boundaries share) to a range of spans: an address whose bits read b lies in one of
// spans first[b]..first[b+1].
type spanIndex struct {
	shift, bits uint8
	first       []uint32
}

// prefixNest is the tree of a family's distinct prefixes with their rules.
type prefixNest struct {
	node  []prefixNode
	rules ruleGroups // the groups of prefixes with several rules
}

type prefixNode struct {
	parent int32 // the prefix directly enclosing this one, or -1
	ref    ruleRef
}

func newIPSet(targets []Target) ipSet {
	n4, n6 := 0, 0
	for _, t := range targets {
		if t.IsAddress() && t.Prefix.IsValid() {
			if t.Prefix.Addr().Is4() {
				n4++
			} else {
				n6++
			}
		}
	}
	v4, v6 := make([]prefixItem, 0, n4), make([]prefixItem, 0, n6)
	for i, t := range targets {
		if !t.IsAddress() || !t.Prefix.IsValid() {
			continue
		}
		p := t.Prefix.Masked()
		it := prefixItem{first: u128Of(p.Addr()), bits: uint8(p.Bits()), port: t.Port, rule: uint32(i)}
		if p.Addr().Is4() {
			v4 = append(v4, it)
		} else {
			v6 = append(v6, it)
		}
	}
	var s ipSet
	starts, inner, nest := cutSpans(v4, 32)
	s.v4 = family4{spans: make([]span4, len(starts)), index: newSpanIndex(starts, 32), nest: nest}
	for i, n := range inner {
		s.v4.spans[i] = span4{start: uint32(starts[i].lo), inner: n, ref: nest.refOf(n)}
	}
	starts, inner, nest = cutSpans(v6, 128)
	s.v6 = family6{spans: make([]span6, len(starts)), index: newSpanIndex(starts, 128), nest: nest}
	for i, n := range inner {
		s.v6.spans[i] = span6{start: starts[i], inner: n, ref: nest.refOf(n)}
	}
	return s
}

// empty reports whether the set has no rule at all.
func (s *ipSet) empty() bool { return len(s.v4.nest.node) == 0 && len(s.v6.nest.node) == 0 }

// lookup returns the address rule that decides addr on port, or -1: the innermost
// covering prefix that has a rule for the port.
func (s *ipSet) lookup(targets []Target, addr netip.Addr, port uint16, allowlist bool) int {
	return s.locate(addr).pick(targets, port, allowlist)
}

// addrSpot is where an address sits: the family's prefix tree, the innermost prefix
// around the address (-1: none) and that prefix's rules.
type addrSpot struct {
	nest  *prefixNest
	inner int32
	ref   ruleRef
}

func (s *ipSet) locate(addr netip.Addr) addrSpot {
	switch {
	case addr.Is4():
		sp := &s.v4.spans[s.v4.find(uint32(u128Of(addr).lo))]
		return addrSpot{&s.v4.nest, sp.inner, sp.ref}
	case addr.Is6() && addr.Zone() == "":
		// A zoned address is never covered, as netip.Prefix.Contains has it.
		sp := &s.v6.spans[s.v6.find(u128Of(addr))]
		return addrSpot{&s.v6.nest, sp.inner, sp.ref}
	}
	return addrSpot{inner: -1}
}

// pick walks from the innermost prefix outwards to the first prefix with a rule for
// the port, and returns that rule or -1.
func (l addrSpot) pick(targets []Target, port uint16, allowlist bool) int {
	for p, ref := l.inner, l.ref; p >= 0; {
		if r := l.nest.rules.pickRef(ref, targets, port, allowlist); r >= 0 {
			return r
		}
		if p = l.nest.node[p].parent; p >= 0 {
			ref = l.nest.node[p].ref
		}
	}
	return -1
}

// find returns the span holding v: the last one starting at or below it.
func (f *family4) find(v uint32) int {
	last := len(f.spans) - 1
	if last == 0 || v < f.spans[1].start {
		return 0
	}
	if v >= f.spans[last].start {
		return last
	}
	// Here v shares the boundaries' first shift bits, and bits >= 1.
	b := v << f.index.shift >> (32 - f.index.bits)
	lo, hi := int(f.index.first[b]), int(f.index.first[b+1])
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if f.spans[mid].start <= v {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

func (f *family6) find(v u128) int {
	last := len(f.spans) - 1
	if last == 0 || v.less(f.spans[1].start) {
		return 0
	}
	if !v.less(f.spans[last].start) {
		return last
	}
	b := v.shl(uint(f.index.shift)).hi >> (64 - f.index.bits)
	lo, hi := int(f.index.first[b]), int(f.index.first[b+1])
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if !v.less(f.spans[mid].start) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// maxIndexBits bounds the radix index at 2^22 entries (16 MiB).
const maxIndexBits = 22

// newSpanIndex indexes span starts of a family of width bits. The index has about
// half as many entries as there are spans, over the bits right after those that the
// boundaries inside the space (starts[1] to the last) all share.
func newSpanIndex(starts []u128, width int) spanIndex {
	last := len(starts) - 1
	if last < 2 {
		return spanIndex{} // find decides without the index
	}
	shift := starts[1].commonPrefixLen(starts[last]) - (128 - width)
	k := min(bits.Len(uint(len(starts)))-1, width-shift, maxIndexBits)
	base := starts[1].and(hostMask(width - shift).not())
	step := width - shift - k // bucket b starts at base + b<<step
	idx := spanIndex{shift: uint8(shift), bits: uint8(k), first: make([]uint32, 1<<k+1)}
	i := 0
	for b := 0; b < 1<<k; b++ {
		at := base.or(u128{lo: uint64(b)}.shl(uint(step)))
		for i < last && !at.less(starts[i+1]) {
			i++
		}
		idx.first[b] = uint32(i)
	}
	idx.first[1<<k] = uint32(last)
	return idx
}

// refOf returns the ref of prefix p, 0 for none.
func (n *prefixNest) refOf(p int32) ruleRef {
	if p < 0 {
		return 0
	}
	return n.node[p].ref
}

// prefixItem is one address rule, as gathered while compiling.
type prefixItem struct {
	first u128 // the prefix's first address
	rule  uint32
	port  uint16
	bits  uint8
}

// cutSpans builds one family's spans (their starts, and the innermost prefix of each)
// and its prefix tree. width is the family's address length in bits.
func cutSpans(items []prefixItem, width int) ([]u128, []int32, prefixNest) {
	// Enclosing prefixes sort before the prefixes inside them.
	slices.SortFunc(items, func(a, b prefixItem) int {
		if c := a.first.compare(b.first); c != 0 {
			return c
		}
		return cmp.Compare(a.bits, b.bits)
	})
	max := hostMask(width)
	starts := append(make([]u128, 0, 2*len(items)+1), u128{})
	inner := append(make([]int32, 0, 2*len(items)+1), -1)
	// emit starts a span at at; a span starting at the same place replaces the previous
	// one (it is either further inside, or what follows a closed prefix).
	emit := func(at u128, n int32) {
		if k := len(starts) - 1; starts[k] == at {
			inner[k] = n
			return
		}
		starts = append(starts, at)
		inner = append(inner, n)
	}
	nest := prefixNest{node: make([]prefixNode, 0, len(items))}
	groups := make([]groupItem, 0, len(items))
	type openPrefix struct {
		node int32
		last u128 // the prefix's last address
	}
	var open []openPrefix // the prefixes around the current position, outermost first
	top := func() int32 {
		if len(open) == 0 {
			return -1
		}
		return open[len(open)-1].node
	}
	// closeBefore closes the open prefixes that end before at (every: all of them).
	closeBefore := func(at u128, every bool) {
		for len(open) > 0 {
			last := open[len(open)-1].last
			if !every && !last.less(at) {
				return
			}
			open = open[:len(open)-1]
			if last != max {
				emit(last.addOne(), top())
			}
		}
	}
	for i, it := range items {
		if i == 0 || it.first != items[i-1].first || it.bits != items[i-1].bits {
			closeBefore(it.first, false)
			n := int32(len(nest.node))
			nest.node = append(nest.node, prefixNode{parent: top()})
			emit(it.first, n)
			open = append(open, openPrefix{node: n, last: it.first.or(hostMask(width - int(it.bits)))})
		}
		groups = append(groups, groupItem{group: uint32(len(nest.node) - 1), port: it.port, rule: it.rule})
	}
	closeBefore(max, true)
	nest.node = slices.Clip(nest.node)
	var refs []ruleRef
	nest.rules, refs = groupRules(len(nest.node), groups)
	for i := range nest.node {
		nest.node[i].ref = refs[i]
	}
	return starts, inner, nest
}

// u128 is a 128-bit address value (IPv4 in the low 32 bits).
type u128 struct{ hi, lo uint64 }

func u128Of(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

// hostMask has the low n bits set (0 <= n <= 128).
func hostMask(n int) u128 {
	if n >= 64 {
		return u128{hi: 1<<(n-64) - 1, lo: ^uint64(0)}
	}
	return u128{lo: 1<<n - 1}
}

func (a u128) or(b u128) u128  { return u128{a.hi | b.hi, a.lo | b.lo} }
func (a u128) and(b u128) u128 { return u128{a.hi & b.hi, a.lo & b.lo} }
func (a u128) not() u128       { return u128{^a.hi, ^a.lo} }

// shl shifts left by n < 128 bits.
func (a u128) shl(n uint) u128 {
	if n >= 64 {
		return u128{hi: a.lo << (n - 64)}
	}
	return u128{hi: a.hi<<n | a.lo>>(64-n), lo: a.lo << n}
}

func (a u128) less(b u128) bool { return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo }

func (a u128) compare(b u128) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

func (a u128) commonPrefixLen(b u128) int {
	if x := a.hi ^ b.hi; x != 0 {
		return bits.LeadingZeros64(x)
	}
	return 64 + bits.LeadingZeros64(a.lo^b.lo)
}

func (a u128) addOne() u128 {
	lo := a.lo + 1
	hi := a.hi
	if lo == 0 {
		hi++
	}
	return u128{hi, lo}
}
