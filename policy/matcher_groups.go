package policy

import "sort"

// ruleGroups holds, for each key of a rule set (one name, one wildcard suffix or one
// prefix), the rules written for that key, ordered by port and then by position in the
// policy. A key usually has one rule; several differ by port (or are duplicates that a
// hand-built Policy kept).
type ruleGroups struct {
	start []uint32 // the rules of group g are rule[start[g]:start[g+1]]
	rule  []uint32 // index into Policy.Targets
	port  []uint16 // rule's port; 0 (every port) sorts first
}

// ruleRef names the rules of one key in a word that lookup structures store in place
// of the key: most keys have one rule, whose index (plus one, so that 0 stays free for
// "empty") the reference holds directly; with groupFlag set it is a group of ruleGroups.
type ruleRef uint32

const groupFlag ruleRef = 1 << 31

// ref returns the reference to group id.
func (g *ruleGroups) ref(id uint32) ruleRef {
	if lo := g.start[id]; g.start[id+1]-lo == 1 {
		return ruleRef(g.rule[lo] + 1)
	}
	return ruleRef(id) | groupFlag
}

// first returns the first rule of the key ref names.
func (g *ruleGroups) first(ref ruleRef) int {
	if ref&groupFlag == 0 {
		return int(ref) - 1
	}
	return int(g.rule[g.start[ref&^groupFlag]])
}

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

// newRuleGroups lays out items into n groups. A counting sort by group keeps it linear in
// the number of rules; only groups of several rules are sorted by port.
func newRuleGroups(n int, items []groupItem) ruleGroups {
	g := ruleGroups{
		start: make([]uint32, n+1),
		rule:  make([]uint32, len(items)),
		port:  make([]uint16, len(items)),
	}
	for _, it := range items {
		g.start[it.group+1]++
	}
	for i := 1; i <= n; i++ {
		g.start[i] += g.start[i-1]
	}
	next := make([]uint32, n)
	copy(next, g.start[:n])
	for _, it := range items {
		at := next[it.group]
		next[it.group]++
		g.rule[at], g.port[at] = it.rule, it.port
	}
	for id := 0; id < n; id++ {
		lo, hi := g.start[id], g.start[id+1]
		if hi-lo > 1 {
			sort.Sort(byPortThenRule{g.port[lo:hi], g.rule[lo:hi]})
		}
	}
	return g
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
