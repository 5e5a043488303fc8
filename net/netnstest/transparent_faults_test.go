package netnstest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netlink"

	"github.com/compass-egress/compass-egress/net/nftredirect"
)

// deletedRule removes the TCP redirect: Check names it, the agent's TCP goes
// nowhere (forwarding is off), and Ensure puts it back with counters kept.
func (s *setup) deletedRule(t *testing.T) {
	before := s.counters(t)
	c, err := nftables.New(nftables.WithNetNSFd(int(s.sidecar.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Name: nftredirect.DefaultTable, Family: nftables.TableFamilyINet}
	rules, err := c.GetRules(tab, &nftables.Chain{Table: tab, Name: "redirect"})
	if err != nil {
		t.Fatal(err)
	}
	const name = "tcp to the transparent listener"
	for _, r := range rules {
		if cm, _ := userdata.GetString(r.UserData, userdata.TypeComment); cm == name {
			if err := c.DelRule(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	s.expectProblem(t, `rule "`+name+`" is missing`)
	s.expectNoTCP(t)
	if !s.ensure(t) {
		t.Fatal("nftredirect.Ensure did not repair the table")
	}
	after := s.counters(t)
	for _, cl := range nftredirect.Classes {
		if after[cl].Packets < before[cl].Packets {
			t.Errorf("counter %s went from %v to %v across the repair", cl, before[cl], after[cl])
		}
	}
	s.expectRepaired(t)
}

// downedLink sets the sidecar's end down: Check names it, the agent's TCP
// goes nowhere, and Ensure brings it back.
func (s *setup) downedLink(t *testing.T) {
	h, err := netlink.NewHandleAt(s.sidecar.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(s.link.SidecarName)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	s.expectProblem(t, "link ce-s0 in sidecar namespace")
	s.expectProblem(t, "is down")
	s.expectNoTCP(t)
	s.ensure(t)
	s.expectRepaired(t)
}

func (s *setup) expectProblem(t *testing.T, part string) {
	t.Helper()
	p := s.problems(t)
	for _, line := range p {
		if strings.Contains(line, part) {
			return
		}
	}
	t.Fatalf("Check = %q, want a problem containing %q", p, part)
}

// expectNoTCP: a connection to an outside address fails and nothing reaches
// the transparent listener.
func (s *setup) expectNoTCP(t *testing.T) {
	t.Helper()
	c, err := s.dial("tcp4", "203.0.113.7:22")
	if err == nil {
		c.Close()
		t.Fatal("the agent connected to 203.0.113.7:22 through a broken path")
	}
	if err := s.tcp.SetDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if sc, err := s.tcp.Accept(); err == nil {
		sc.Close()
		t.Fatal("the transparent listener got a connection through a broken path")
	}
}

func (s *setup) expectRepaired(t *testing.T) {
	t.Helper()
	if p := s.problems(t); len(p) != 0 {
		t.Fatalf("Check after repair: %q", p)
	}
	s.expectRedirected(t, s.tcp, "203.0.113.7:22")
}

// remove takes the table and the link away: both namespaces are back to what
// they had, and the agent has no default route.
func (s *setup) remove(t *testing.T) {
	if err := nftredirect.Remove(s.sidecar.Handle, s.table.Table); err != nil {
		t.Fatal(err)
	}
	if err := vethlinkRemove(s); err != nil {
		t.Fatal(err)
	}
	if got := linkNames(t, s.agent); got != "lo" {
		t.Errorf("agent links after Remove = %s, want lo", got)
	}
	if got := linkNames(t, s.sidecar); got != "lo" {
		t.Errorf("sidecar links after Remove = %s, want lo", got)
	}
	if got := tableNames(t, s.sidecar); got != "" {
		t.Errorf("sidecar tables after Remove = %s, want none", got)
	}
	if _, err := nftredirect.Counters(s.sidecar.Handle, s.table.Table); !errors.Is(err, nftredirect.ErrNoTable) {
		t.Errorf("Counters after Remove: %v, want ErrNoTable", err)
	}
	s.expectProblem(t, "has no default route via 169.254.77.2 dev ce-a0")
	s.expectProblem(t, "table inet compass_transparent is missing")
}
