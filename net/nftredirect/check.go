package nftredirect

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nssysctl"
)

// Check reads the table in ns back and returns one line for every chain,
// rule and counter that is missing, different or unexpected, and one if
// forwarding is on (the sidecar must never route the agent's packets). No
// problems means the table is exactly what Ensure writes. err is only for
// failing to read.
func Check(ns netns.NsHandle, s Spec) (problems []string, err error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	conn, err := open(ns)
	if err != nil {
		return nil, err
	}
	problems, err = checkTable(conn, s)
	if err != nil {
		return nil, fmt.Errorf("nftredirect: check table inet %s in namespace %s: %w", s.table(), ns, err)
	}
	fwd, err := checkForwarding(ns)
	if err != nil {
		return nil, err
	}
	return append(problems, fwd...), nil
}

func checkForwarding(ns netns.NsHandle) ([]string, error) {
	var problems []string
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		v, err := nssysctl.Get(ns, key)
		if errors.Is(err, fs.ErrNotExist) {
			continue // IPv6 disabled in this kernel: nothing to forward
		}
		if err != nil {
			return nil, err
		}
		if v != "0" {
			problems = append(problems, fmt.Sprintf("forwarding is on (%s=%s): want 0", key, v))
		}
	}
	return problems, nil
}

// checkTable compares the kernel's table with build(s).
func checkTable(conn *nftables.Conn, s Spec) ([]string, error) {
	t, err := findTable(conn, s.table())
	if errors.Is(err, ErrNoTable) {
		return []string{fmt.Sprintf("table inet %s is missing", s.table())}, nil
	}
	if err != nil {
		return nil, err
	}
	want := build(s)
	problems, err := checkChains(conn, t, want)
	if err != nil {
		return nil, err
	}
	counts, err := readCounters(conn, s.table())
	if err != nil {
		return nil, err
	}
	for _, c := range Classes {
		if _, ok := counts[c]; !ok {
			problems = append(problems, fmt.Sprintf("counter %q is missing", c))
		}
	}
	return problems, nil
}

func checkChains(conn *nftables.Conn, t *nftables.Table, want layout) ([]string, error) {
	all, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	got := map[string]*nftables.Chain{}
	for _, c := range all {
		if c.Table.Name == t.Name {
			got[c.Name] = c
		}
	}
	var problems []string
	for _, w := range want.chains {
		g, ok := got[w.Name]
		delete(got, w.Name)
		if !ok {
			problems = append(problems, fmt.Sprintf("chain %s is missing", w.Name))
			continue
		}
		if d := chainDiff(w, g); d != "" {
			problems = append(problems, fmt.Sprintf("chain %s: %s", w.Name, d))
		}
		rules, err := conn.GetRules(t, g)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s: %w", w.Name, err)
		}
		problems = append(problems, ruleDiff(w.Name, want.rules[w.Name], rules)...)
	}
	for name := range got {
		problems = append(problems, fmt.Sprintf("chain %s is unexpected", name))
	}
	return problems, nil
}

func chainDiff(w, g *nftables.Chain) string {
	switch {
	case w.Type != g.Type:
		return fmt.Sprintf("type %q, want %q", g.Type, w.Type)
	case !eqPtr(w.Hooknum, g.Hooknum):
		return "hook differs"
	case !eqPtr(w.Priority, g.Priority):
		return "priority differs"
	case !eqPtr(w.Policy, g.Policy):
		return "policy differs"
	}
	return ""
}

func eqPtr[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// ruleDiff matches rules by their comment, then checks expressions and order.
func ruleDiff(chain string, want, got []*nftables.Rule) []string {
	var problems []string
	byComment := map[string]*nftables.Rule{}
	for _, g := range got {
		c := comment(g)
		if _, dup := byComment[c]; dup || !isWanted(c, want) {
			problems = append(problems, fmt.Sprintf("chain %s: rule %q (handle %d) is unexpected", chain, c, g.Handle))
			continue
		}
		byComment[c] = g
	}
	inOrder := len(got) == len(want)
	for i, w := range want {
		c := comment(w)
		g, ok := byComment[c]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("chain %s: rule %q is missing", chain, c))
		case !sameExprs(w, g):
			problems = append(problems, fmt.Sprintf("chain %s: rule %q (handle %d) differs from the spec", chain, c, g.Handle))
		}
		inOrder = inOrder && comment(got[i]) == c
	}
	if len(problems) == 0 && !inOrder {
		problems = append(problems, fmt.Sprintf("chain %s: rules are out of order", chain))
	}
	return problems
}

func isWanted(c string, want []*nftables.Rule) bool {
	for _, w := range want {
		if comment(w) == c {
			return true
		}
	}
	return false
}

func comment(r *nftables.Rule) string {
	c, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return c
}

// sameExprs compares two rules by their netlink encoding, which is what the
// kernel executes; decoded structs may differ in fields the kernel ignores.
func sameExprs(w, g *nftables.Rule) bool {
	if len(w.Exprs) != len(g.Exprs) {
		return false
	}
	fam := byte(nftables.TableFamilyINet)
	for i := range w.Exprs {
		a, errA := expr.Marshal(fam, w.Exprs[i])
		b, errB := expr.Marshal(fam, g.Exprs[i])
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			return false
		}
	}
	return true
}
