package policy

func checkModal(c Capability, ph Phase, p Policy) ErrorList {
	if p.Mode != ModeAllowlist {
		return nil
	}
	var errs ErrorList
	for i, t := range p.Targets {
		c.refusePort(ph, p, i, &errs)
		if t.Kind == KindWildcard {
			errs.add(c.refuseEntry(ph, p, i, "wildcard host names are not supported; list each host name"))
		}
	}
	return errs
}

// modalOptions maps a checked policy onto Modal's sandbox options. In allowlist mode
// both lists are always written, the unused one empty: Modal reads an absent CIDR list as
// "every address allowed". Addresses become single-address CIDRs (/32, /128). An empty
// allowlist is block_network.
func modalOptions(p Policy) NativeOptions {
	switch {
	case p.Mode == ModePublic:
		return NativeOptions{"block_network": false}
	case p.Mode == ModeNoNetwork, p.Mode == ModeAllowlist && len(p.Targets) == 0:
		return NativeOptions{"block_network": true}
	}
	domains, cidrs := []string{}, []string{}
	for _, t := range p.Targets {
		if t.IsAddress() {
			cidrs = append(cidrs, t.Prefix.String())
		} else {
			domains = append(domains, t.HostString())
		}
	}
	return NativeOptions{"block_network": false, "outbound_cidr_allowlist": cidrs, "outbound_domain_allowlist": domains}
}
