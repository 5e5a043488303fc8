package policy

import (
	"cmp"
	"net/netip"
	"slices"
)

// ipSet finds the IP and CIDR rules covering an address.
//
// Each family's address space is cut into disjoint intervals at every prefix boundary;
// each interval records the innermost prefix covering it. A lookup is one binary search
// for the interval, then a walk outwards through the enclosing prefixes (at most one
// per prefix length) until one has a rule for the port. An address rule is the
// full-length prefix of its address.
type ipSet struct {
	v4 intervals4
	v6 intervals6
}

// intervals4 cuts the IPv4 space: interval i is [start[i], start[i+1]).
type intervals4 struct {
	start []uint32 // ascending; start[0] == 0
	inner []int32  // innermost prefix covering interval i, or -1
	nest  prefixNest
}

// intervals6 is intervals4 for IPv6 (IPv4-mapped addresses included, as IPv6).
type intervals6 struct {
	start []u128
	inner []int32
	nest  prefixNest
}

// prefixNest is the tree of a family's distinct prefixes and their rules.
type prefixNest struct {
	parent []int32    // the prefix directly enclosing prefix n, or -1
	rules  ruleGroups // group n holds the rules of prefix n
	count  int        // number of distinct prefixes
}

func newIPSet(targets []Target) ipSet {
	var v4, v6 []prefixItem
	for i, t := range targets {
		if !t.IsAddress() || !t.Prefix.IsValid() {
			continue
		}
		p := t.Prefix.Masked()
		it := prefixItem{first: u128Of(p.Addr()), bits: uint8(p.Bits()), port: t.Port, rule: uint32(i)}
		if p.Addr().Is4() {
			it.last = it.first.or(hostMask(32 - p.Bits()))
			v4 = append(v4, it)
		} else {
			it.last = it.first.or(hostMask(128 - p.Bits()))
			v6 = append(v6, it)
		}
	}
	var s ipSet
	starts, inner, nest := cutIntervals(v4, hostMask(32))
	s.v4 = intervals4{start: make([]uint32, len(starts)), inner: inner, nest: nest}
	for i, a := range starts {
		s.v4.start[i] = uint32(a.lo)
	}
	s.v6.start, s.v6.inner, s.v6.nest = cutIntervals(v6, hostMask(128))
	return s
}

// empty reports whether the set has no rule at all.
func (s *ipSet) empty() bool { return s.v4.nest.count == 0 && s.v6.nest.count == 0 }

// lookup returns the address rule that decides addr on port, or -1: the innermost
// covering prefix that has a rule for the port.
func (s *ipSet) lookup(addr netip.Addr, port uint16, allowlist bool) int {
	switch {
	case addr.Is4():
		v := uint32(u128Of(addr).lo)
		return s.v4.nest.pick(s.v4.inner[s.v4.find(v)], port, allowlist)
	case addr.Is6() && addr.Zone() == "":
		// A zoned address is never covered, as netip.Prefix.Contains has it.
		return s.v6.nest.pick(s.v6.inner[s.v6.find(u128Of(addr))], port, allowlist)
	}
	return -1
}

// find returns the interval holding v: the last one starting at or below it.
func (iv *intervals4) find(v uint32) int {
	lo, hi := 0, len(iv.start)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if iv.start[mid] <= v {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

func (iv *intervals6) find(v u128) int {
	lo, hi := 0, len(iv.start)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if !v.less(iv.start[mid]) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// pick walks from prefix n outwards to the first prefix with a rule for the port.
func (n *prefixNest) pick(p int32, port uint16, allowlist bool) int {
	for ; p >= 0; p = n.parent[p] {
		if r := n.rules.pick(uint32(p), port, allowlist); r >= 0 {
			return r
		}
	}
	return -1
}

// prefixItem is one address rule, as gathered while compiling.
type prefixItem struct {
	first, last u128 // the range the prefix covers, inclusive
	bits        uint8
	port        uint16
	rule        uint32
}

// cutIntervals builds one family's intervals and prefix tree. max is the family's
// highest address.
func cutIntervals(items []prefixItem, max u128) ([]u128, []int32, prefixNest) {
	// Enclosing prefixes sort before the prefixes inside them; the rules of one prefix
	// end up together, ordered by port and then by policy position.
	slices.SortFunc(items, func(a, b prefixItem) int {
		if c := a.first.compare(b.first); c != 0 {
			return c
		}
		if c := cmp.Compare(a.bits, b.bits); c != 0 {
			return c
		}
		if c := cmp.Compare(a.port, b.port); c != 0 {
			return c
		}
		return cmp.Compare(a.rule, b.rule)
	})
	starts := []u128{{}}
	inner := []int32{-1}
	// emit starts an interval at at; an interval starting at the same place replaces
	// the previous one (it is either further inside, or what follows a closed prefix).
	emit := func(at u128, n int32) {
		if k := len(starts) - 1; starts[k] == at {
			inner[k] = n
			return
		}
		starts = append(starts, at)
		inner = append(inner, n)
	}
	var nest prefixNest
	groups := make([]groupItem, 0, len(items))
	var open []int32 // the prefixes around the current position, outermost first
	var lasts []u128 // the last address of each prefix
	top := func() int32 {
		if len(open) == 0 {
			return -1
		}
		return open[len(open)-1]
	}
	// closeBefore closes the open prefixes that end before at.
	closeBefore := func(at u128, all bool) {
		for len(open) > 0 {
			last := lasts[top()]
			if !all && !last.less(at) {
				return
			}
			open = open[:len(open)-1]
			if last != max {
				emit(last.addOne(), top())
			}
		}
	}
	for i, it := range items {
		if i > 0 && it.first == items[i-1].first && it.bits == items[i-1].bits {
			groups = append(groups, groupItem{group: uint32(nest.count - 1), port: it.port, rule: it.rule})
			continue
		}
		closeBefore(it.first, false)
		n := int32(nest.count)
		nest.count++
		nest.parent = append(nest.parent, top())
		lasts = append(lasts, it.last)
		emit(it.first, n)
		open = append(open, n)
		groups = append(groups, groupItem{group: uint32(n), port: it.port, rule: it.rule})
	}
	closeBefore(max, true)
	nest.rules = newRuleGroups(nest.count, groups)
	return slices.Clip(starts), slices.Clip(inner), nest
}

// u128 is a 128-bit address value (IPv4 in the low 32 bits).
type u128 struct{ hi, lo uint64 }

func u128Of(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var v u128
	for i := 0; i < 8; i++ {
		v.hi = v.hi<<8 | uint64(b[i])
		v.lo = v.lo<<8 | uint64(b[8+i])
	}
	return v
}

// hostMask has the low n bits set (0 <= n <= 128).
func hostMask(n int) u128 {
	if n >= 64 {
		return u128{hi: 1<<(n-64) - 1, lo: ^uint64(0)}
	}
	return u128{lo: 1<<n - 1}
}

func (a u128) or(b u128) u128 { return u128{a.hi | b.hi, a.lo | b.lo} }

func (a u128) less(b u128) bool { return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo }

func (a u128) compare(b u128) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

func (a u128) addOne() u128 {
	lo := a.lo + 1
	hi := a.hi
	if lo == 0 {
		hi++
	}
	return u128{hi, lo}
}
