package policy

import "sort"

// ruleGroups holds the rules of the keys of a rule set (names, wildcard suffixes or
// prefixes) that have several: rules that differ by port, or duplicates that a
// hand-built Policy kept. Each group is ordered by port, then by position in the
// policy. A key with one rule needs no group (see ruleRef).
type ruleGroups struct {
	start []uint32 // the rules of group g are rule[start[g]:start[g+1]]
	rule  []uint32 // index into Policy.Targets
	port  []uint16 // rule's port; 0 (every port) sorts first
}

// ruleRef names the rules of one key in a word that lookup structures store in place
// of the key: most keys have one rule, whose index (plus one, so that 0 stays free for
// "empty") the reference holds directly; with groupFlag set it is a group of ruleGroups.
// A policy's rules are counted in millions, far below the flag bit.
type ruleRef uint32

const groupFlag ruleRef = 1 << 31

// pickRef is pick for the rules ref names; a lone rule's port is read from targets.
func (g *ruleGroups) pickRef(ref ruleRef, targets []Target, port uint16, allowlist bool) int {
	if ref&groupFlag != 0 {
		return g.pick(uint32(ref&^groupFlag), port, allowlist)
	}
	r := int(ref) - 1
	if coversPort(targets[r].Port, port, allowlist) {
		return r
	}
	return -1
}

// coversPort reports whether a rule for rulePort (0: every port) decides a connection
// to port; port 0 ("some port") is answered by any allowlist rule but only by an
// every-port denylist rule.
func coversPort(rulePort, port uint16, allowlist bool) bool {
	return rulePort == 0 || rulePort == port || (port == 0 && allowlist)
}

// groupItem is one rule of a group, as gathered while compiling.
type groupItem struct {
	group uint32
	port  uint16
	rule  uint32
}

// linearPortScan is the group size up to which a port is looked for by a plain scan.
const linearPortScan = 8

// groupRules sorts the rules of n keys into groups and returns, for each key, the
// reference to its rules. Only keys of several rules keep a group. A counting sort by
// key keeps it linear in the number of rules; only groups are sorted by port.
func groupRules(n int, items []groupItem) (ruleGroups, []ruleRef) {
	start := make([]uint32, n+1)
	for _, it := range items {
		start[it.group+1]++
	}
	for i := 1; i <= n; i++ {
		start[i] += start[i-1]
	}
	next := make([]uint32, n)
	copy(next, start[:n])
	byKey := make([]groupItem, len(items))
	for _, it := range items {
		byKey[next[it.group]] = it
		next[it.group]++
	}
	refs := make([]ruleRef, n)
	var g ruleGroups
	for k := 0; k < n; k++ {
		lo, hi := start[k], start[k+1]
		if hi-lo == 1 {
			refs[k] = ruleRef(byKey[lo].rule + 1)
			continue
		}
		refs[k] = ruleRef(len(g.start)) | groupFlag
		g.start = append(g.start, uint32(len(g.rule)))
		at := len(g.rule)
		for _, it := range byKey[lo:hi] {
			g.rule = append(g.rule, it.rule)
			g.port = append(g.port, it.port)
		}
		sort.Sort(byPortThenRule{g.port[at:], g.rule[at:]})
	}
	g.start = append(g.start, uint32(len(g.rule)))
	return g, refs
}

// pick returns the rule of group id that decides a connection to port, or -1.
//
// A rule naming the port wins over one covering every port. Port 0 asks about "some
// port": in an allowlist any rule of the group answers (the every-port rule first, else
// the lowest port); in a denylist only a rule covering every port does.
func (g *ruleGroups) pick(id uint32, port uint16, allowlist bool) int {
	lo, hi := g.start[id], g.start[id+1]
	ports := g.port[lo:hi]
	if port == 0 {
		if allowlist || ports[0] == 0 {
			return int(g.rule[lo])
		}
		return -1
	}
	if i := lowerBound(ports, port); i < len(ports) && ports[i] == port {
		return int(g.rule[lo+uint32(i)])
	}
	if ports[0] == 0 {
		return int(g.rule[lo])
	}
	return -1
}

// lowerBound is the first index of ports (sorted) whose value is not below port.
func lowerBound(ports []uint16, port uint16) int {
	if len(ports) <= linearPortScan {
		for i, p := range ports {
			if p >= port {
				return i
			}
		}
		return len(ports)
	}
	lo, hi := 0, len(ports)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if ports[mid] < port {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// byPortThenRule sorts one group's parallel slices by port, then by policy position.
type byPortThenRule struct {
	port []uint16
	rule []uint32
}

func (s byPortThenRule) Len() int { return len(s.port) }

func (s byPortThenRule) Less(i, j int) bool {
	if s.port[i] != s.port[j] {
		return s.port[i] < s.port[j]
	}
	return s.rule[i] < s.rule[j]
}

func (s byPortThenRule) Swap(i, j int) {
	s.port[i], s.port[j] = s.port[j], s.port[i]
	s.rule[i], s.rule[j] = s.rule[j], s.rule[i]
}
