package nftredirect

import (
	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Chain names in the table.
const (
	chainGuard    = "guard"    // raw prerouting: picks the link's packets
	chainAgent    = "agent"    // drops what the sidecar does not take
	chainRedirect = "redirect" // nat prerouting: sends TCP and DNS to the listeners
)

// layout is the whole table a Spec asks for, in the order it is written.
type layout struct {
	table  *nftables.Table
	chains []*nftables.Chain
	rules  map[string][]*nftables.Rule // by chain name, in order
}

// rule is one rule before it is bound to its table and chain. The comment
// names it in `nft list` output and lets Check find it again.
type rule struct {
	comment string
	exprs   exprs
}

func build(s Spec) layout {
	t := &nftables.Table{Name: s.table(), Family: nftables.TableFamilyINet}
	accept := nftables.ChainPolicyAccept
	guard := &nftables.Chain{Name: chainGuard, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept}
	agent := &nftables.Chain{Name: chainAgent, Table: t}
	redirect := &nftables.Chain{Name: chainRedirect, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}

	l := layout{table: t, chains: []*nftables.Chain{guard, agent, redirect}, rules: map[string][]*nftables.Rule{}}
	for _, c := range []struct {
		chain *nftables.Chain
		rules []rule
	}{{guard, guardRules(s)}, {agent, agentRules(s)}, {redirect, redirectRules(s)}} {
		for _, r := range c.rules {
			l.rules[c.chain.Name] = append(l.rules[c.chain.Name], &nftables.Rule{
				Table: t, Chain: c.chain, Exprs: r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment),
			})
		}
	}
	return l
}

func guardRules(s Spec) []rule {
	return []rule{
		{"from agent", exprs{}.iifname(s.Interface).jump(chainAgent)},
	}
}

func agentRules(s Spec) []rule {
	return []rule{
		{"not ipv4", exprs{}.nfproto(neq, unix.NFPROTO_IPV4).count(ClassOther).drop()},
		{"spoofed source", exprs{}.nfproto(eq, unix.NFPROTO_IPV4).ipSaddr(neq, s.AgentAddr).count(ClassSpoofed).drop()},
		{"tcp", exprs{}.l4proto(unix.IPPROTO_TCP).accept()},
		{"dns over udp", exprs{}.l4proto(unix.IPPROTO_UDP).dport(53).accept()},
		{"other udp", exprs{}.l4proto(unix.IPPROTO_UDP).count(ClassUDP).drop()},
		{"icmp", exprs{}.l4proto(unix.IPPROTO_ICMP).count(ClassICMP).drop()},
		{"other protocols", exprs{}.count(ClassOther).drop()},
	}
}

func redirectRules(s Spec) []rule {
	return []rule{
		{"dns over udp", exprs{}.iifname(s.Interface).nfproto(eq, unix.NFPROTO_IPV4).l4proto(unix.IPPROTO_UDP).dport(53).dnat(s.DNS)},
		{"dns over tcp", exprs{}.iifname(s.Interface).nfproto(eq, unix.NFPROTO_IPV4).l4proto(unix.IPPROTO_TCP).dport(53).dnat(s.DNS)},
		// Addresses of the sidecar's own (its link end, its task-network address where
		// the explicit proxy listens) are served by what listens there.
		{"tcp to the transparent listener", exprs{}.iifname(s.Interface).nfproto(eq, unix.NFPROTO_IPV4).
			daddrNotLocal().l4proto(unix.IPPROTO_TCP).redirect(s.TCPPort)},
	}
}
