package policy

import "strings"

// hostSet finds the rules of exact host names and of wildcard suffixes. Its map keys
// are the policy's own Host strings, so compiling copies no name.
type hostSet struct {
	exact  map[string]uint32 // name -> group in exactRules
	suffix map[string]uint32 // wildcard suffix (after "*.") -> group in suffixRules

	exactRules  ruleGroups
	suffixRules ruleGroups

	// suffixLabels has bit n set when some wildcard suffix has n labels (n < 256), so
	// the walk over a long name looks up only suffixes that could exist.
	suffixLabels [4]uint64
}

func newHostSet(targets []Target) hostSet {
	s := hostSet{exact: map[string]uint32{}, suffix: map[string]uint32{}}
	var exact, suffix []groupItem
	for i, t := range targets {
		switch t.Kind {
		case KindHost:
			exact = append(exact, groupItem{group: groupOf(s.exact, t.Host), port: t.Port, rule: uint32(i)})
		case KindWildcard:
			suffix = append(suffix, groupItem{group: groupOf(s.suffix, t.Host), port: t.Port, rule: uint32(i)})
			if n := strings.Count(t.Host, ".") + 1; n < 256 {
				s.suffixLabels[n/64] |= 1 << (n % 64)
			}
		}
	}
	s.exactRules = newRuleGroups(len(s.exact), exact)
	s.suffixRules = newRuleGroups(len(s.suffix), suffix)
	return s
}

// groupOf returns the group of key, adding a new group when the key is new.
func groupOf(groups map[string]uint32, key string) uint32 {
	g, ok := groups[key]
	if !ok {
		g = uint32(len(groups))
		groups[key] = g
	}
	return g
}

// lookup returns the host or wildcard rule that decides name on port, or -1. An exact
// name wins over a wildcard, and a longer wildcard suffix over a shorter one.
func (s *hostSet) lookup(name string, port uint16, allowlist bool) int {
	if name == "" {
		return -1
	}
	if g, ok := s.exact[name]; ok {
		if r := s.exactRules.pick(g, port, allowlist); r >= 0 {
			return r
		}
	}
	if len(s.suffix) == 0 {
		return -1
	}
	// Walk the suffixes after each dot, longest first. A wildcard needs at least one
	// character in front of its suffix, so a dot at position 0 starts no candidate.
	labels := strings.Count(name[1:], ".")
	for i := 1; i < len(name); i++ {
		if name[i] != '.' {
			continue
		}
		n := labels // labels in name[i+1:]: the dots after i, plus one
		labels--
		if n >= 256 || s.suffixLabels[n/64]&(1<<(n%64)) == 0 {
			continue
		}
		if g, ok := s.suffix[name[i+1:]]; ok {
			if r := s.suffixRules.pick(g, port, allowlist); r >= 0 {
				return r
			}
		}
	}
	return -1
}
