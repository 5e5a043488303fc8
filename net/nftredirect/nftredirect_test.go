package nftredirect_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nssysctl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var spec = nftredirect.Spec{
	Interface: "ce-s0",
	AgentAddr: netip.MustParseAddr("169.254.77.1"),
	TCPPort:   15001,
	DNS:       netip.MustParseAddrPort("169.254.77.2:15053"),
}

// sidecarNS is a fresh namespace with forwarding off, as the sidecar runs.
func sidecarNS(t *testing.T) netns.NsHandle {
	ns := netnstest.New(t, "nft")
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		if err := nssysctl.Set(ns.Handle, key, "0"); err != nil {
			t.Fatal(err)
		}
	}
	return ns.Handle
}

func mustCheck(t *testing.T, ns netns.NsHandle, s nftredirect.Spec) problems {
	t.Helper()
	p, err := nftredirect.Check(ns, s)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return p
}

type problems []string

func (p problems) OK() bool { return len(p) == 0 }

func (p problems) has(part string) bool {
	for _, s := range p {
		if strings.Contains(s, part) {
			return true
		}
	}
	return false
}

func TestEnsureIsIdempotent(t *testing.T) {
	ns := sidecarNS(t)
	if r := mustCheck(t, ns, spec); r.OK() || !r.has("table inet compass_transparent is missing") {
		t.Fatalf("Check before Ensure = %v, want the missing table", r)
	}
	for i, wantChanged := range []bool{true, false, false} {
		changed, err := nftredirect.Ensure(ns, spec)
		if err != nil || changed != wantChanged {
			t.Fatalf("Ensure #%d = %v, %v; want changed %v", i+1, changed, err, wantChanged)
		}
		if r := mustCheck(t, ns, spec); !r.OK() {
			t.Fatalf("Check after Ensure #%d: %v", i+1, r)
		}
	}
	// A different spec replaces the table.
	s2 := spec
	s2.TCPPort = 15002
	if r := mustCheck(t, ns, s2); r.OK() {
		t.Fatal("Check with another port = OK, want a difference")
	}
	if changed, err := nftredirect.Ensure(ns, s2); err != nil || !changed {
		t.Fatalf("Ensure(other port) = %v, %v; want changed", changed, err)
	}
	if r := mustCheck(t, ns, s2); !r.OK() {
		t.Fatalf("Check after Ensure(other port): %v", r)
	}
}

// TestCheckFindsDamage damages the table in several ways; Check must name the
// damage and Ensure must repair it.
func TestCheckFindsDamage(t *testing.T) {
	tests := []struct {
		name   string
		damage func(c *nftables.Conn, tab *nftables.Table) error
		want   string
	}{
		{"deleted rule", func(c *nftables.Conn, tab *nftables.Table) error {
			return delRule(c, tab, "agent", 4) // "other udp"
		}, `chain agent: rule "other udp" is missing`},
		{"deleted chain", func(c *nftables.Conn, tab *nftables.Table) error {
			if err := delRule(c, tab, "guard", 0); err != nil {
				return err
			}
			c.DelChain(&nftables.Chain{Table: tab, Name: "redirect"})
			return c.Flush()
		}, "chain redirect is missing"},
		{"foreign rule", func(c *nftables.Conn, tab *nftables.Table) error {
			c.AddRule(&nftables.Rule{Table: tab, Chain: &nftables.Chain{Table: tab, Name: "agent"}})
			return c.Flush()
		}, `chain agent: rule "" (handle`},
		{"emptied table", func(c *nftables.Conn, tab *nftables.Table) error {
			c.AddTable(tab) // replace the table with an empty one
			c.DelTable(tab)
			c.AddTable(tab)
			return c.Flush()
		}, "chain guard is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := sidecarNS(t)
			if _, err := nftredirect.Ensure(ns, spec); err != nil {
				t.Fatal(err)
			}
			c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
			if err != nil {
				t.Fatal(err)
			}
			tab := &nftables.Table{Name: nftredirect.DefaultTable, Family: nftables.TableFamilyINet}
			if err := tt.damage(c, tab); err != nil {
				t.Fatalf("damage: %v", err)
			}
			if r := mustCheck(t, ns, spec); r.OK() || !r.has(tt.want) {
				t.Fatalf("Check = %q, want a problem containing %q", r, tt.want)
			}
			if changed, err := nftredirect.Ensure(ns, spec); err != nil || !changed {
				t.Fatalf("Ensure after damage = %v, %v; want a repair", changed, err)
			}
			if r := mustCheck(t, ns, spec); !r.OK() {
				t.Fatalf("Check after repair: %v", r)
			}
		})
	}
}

func delRule(c *nftables.Conn, tab *nftables.Table, chain string, i int) error {
	rules, err := c.GetRules(tab, &nftables.Chain{Table: tab, Name: chain})
	if err != nil {
		return err
	}
	if err := c.DelRule(rules[i]); err != nil {
		return err
	}
	return c.Flush()
}

func TestCheckReportsForwarding(t *testing.T) {
	ns := sidecarNS(t)
	if _, err := nftredirect.Ensure(ns, spec); err != nil {
		t.Fatal(err)
	}
	if err := nssysctl.Set(ns, "net/ipv4/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	r := mustCheck(t, ns, spec)
	if len(r) != 1 || !strings.Contains(r[0], "forwarding is on (net/ipv4/conf/all/forwarding=1)") {
		t.Fatalf("Check = %q, want only the forwarding problem", r)
	}
}

// TestLeavesOtherTablesAlone: Ensure and Remove touch only their own table,
// like Docker's NAT table that shares the namespace.
func TestLeavesOtherTablesAlone(t *testing.T) {
	ns := sidecarNS(t)
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	other := c.AddTable(&nftables.Table{Name: "nat", Family: nftables.TableFamilyIPv4})
	c.AddChain(&nftables.Chain{Name: "DOCKER_OUTPUT", Table: other})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := nftredirect.Ensure(ns, spec); err != nil {
		t.Fatal(err)
	}
	if err := nftredirect.Remove(ns, ""); err != nil {
		t.Fatal(err)
	}
	if err := nftredirect.Remove(ns, ""); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || tables[0].Name != "nat" {
		t.Fatalf("tables after Remove = %v, want only ip nat", tables)
	}
	if _, err := nftredirect.Counters(ns, ""); !errors.Is(err, nftredirect.ErrNoTable) {
		t.Fatalf("Counters after Remove: %v, want ErrNoTable", err)
	}
}
