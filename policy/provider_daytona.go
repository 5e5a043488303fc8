package policy

// Daytona limits (docs/policy.md §8).
const (
	DaytonaMaxDomainEntries  = 20
	DaytonaMaxNetworkEntries = 10
)

// daytonaIsDomain reports whether an entry goes to domainAllowList (names) rather than
// networkAllowList (IPv4 addresses and ranges).
func daytonaIsDomain(t Target) bool { return t.Kind == KindHost || t.Kind == KindWildcard }

func checkDaytona(c Capability, ph Phase, p Policy) ErrorList {
	if p.Mode != ModeAllowlist {
		return nil
	}
	var errs ErrorList
	domains, networks := 0, 0
	var first *Target // the list's first supported entry sets its family
	for i, t := range p.Targets {
		c.refusePort(ph, p, i, &errs)
		switch {
		case t.IsAddress() && !t.Prefix.Addr().Is4():
			errs.add(c.refuseEntry(ph, p, i, "IPv6 entries are not supported"))
			continue
		case first == nil:
			first = &p.Targets[i]
		case daytonaIsDomain(t) != daytonaIsDomain(*first):
			family := "a domain entry"
			if !daytonaIsDomain(*first) {
				family = "an IPv4 network entry"
			}
			errs.add(c.refuseEntry(ph, p, i, "domain entries and IPv4 network entries cannot be mixed in one list (the list starts with "+family+", "+first.String()+")"))
			continue
		}
		switch {
		case daytonaIsDomain(t):
			domains++
			if domains == DaytonaMaxDomainEntries+1 {
				errs.add(c.refuseEntry(ph, p, i, "at most 20 domain entries are supported"))
			}
		default:
			networks++
			if networks == DaytonaMaxNetworkEntries+1 {
				errs.add(c.refuseEntry(ph, p, i, "at most 10 IPv4 network entries are supported"))
			}
		}
	}
	return errs
}

// daytonaOptions maps a checked policy onto Daytona's sandbox options. In allowlist mode
// both lists are always written, the unused one empty: an absent list would read as
// "no restriction" to the provider. An empty allowlist is block-all.
func daytonaOptions(p Policy) NativeOptions {
	switch {
	case p.Mode == ModePublic:
		return NativeOptions{"networkBlockAll": false}
	case p.Mode == ModeNoNetwork, p.Mode == ModeAllowlist && len(p.Targets) == 0:
		return NativeOptions{"networkBlockAll": true}
	}
	domains, networks := []string{}, []string{}
	for _, t := range p.Targets {
		if daytonaIsDomain(t) {
			domains = append(domains, t.HostString())
		} else {
			networks = append(networks, t.Prefix.String())
		}
	}
	return NativeOptions{"networkBlockAll": false, "networkAllowList": networks, "domainAllowList": domains}
}
