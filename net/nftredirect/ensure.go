package nftredirect

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// Ensure makes the table in ns exactly what s asks for. If it already is,
// nothing changes (changed is false, counters keep counting). Otherwise the
// whole table is replaced in one netlink batch, which the kernel applies as
// one transaction: no packet ever meets a half-written table. Counters carry
// over the values of the table replaced.
func Ensure(ns netns.NsHandle, s Spec) (changed bool, err error) {
	if err := s.Validate(); err != nil {
		return false, err
	}
	conn, err := open(ns)
	if err != nil {
		return false, err
	}
	problems, err := checkTable(conn, s)
	if err != nil {
		return false, fmt.Errorf("nftredirect: ensure table inet %s in namespace %s: %w", s.table(), ns, err)
	}
	if len(problems) == 0 {
		return false, nil
	}
	counts, err := readCounters(conn, s.table())
	if err != nil {
		counts = nil // no table yet (or no counters): start from zero
	}
	l := build(s)
	conn.AddTable(l.table) // so that the delete below cannot fail on a missing table
	conn.DelTable(l.table)
	conn.AddTable(l.table)
	for _, c := range Classes {
		n := counts[c]
		conn.AddObj(&nftables.CounterObj{Table: l.table, Name: string(c), Packets: n.Packets, Bytes: n.Bytes})
	}
	for _, c := range l.chains {
		conn.AddChain(c)
	}
	for _, c := range l.chains {
		for _, r := range l.rules[c.Name] {
			conn.AddRule(r)
		}
	}
	if err := conn.Flush(); err != nil {
		return false, fmt.Errorf("nftredirect: replace table inet %s in namespace %s (%s): %w", s.table(), ns, problems[0], err)
	}
	return true, nil
}

// Remove deletes the table (empty table: DefaultTable) from ns, if it is
// there. With the table gone the sidecar takes nothing from the link, and with
// forwarding off nothing passes: the agent has no egress through it.
func Remove(ns netns.NsHandle, table string) error {
	s := Spec{Table: table}
	if table != "" && !validName(table) {
		return fmt.Errorf("nftredirect: remove: table name %q: want 1-64 letters, digits or _", table)
	}
	conn, err := open(ns)
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: s.table(), Family: nftables.TableFamilyINet}
	conn.AddTable(t) // add-then-delete in one batch: no error when it is already gone
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftredirect: remove table inet %s in namespace %s: %w", s.table(), ns, err)
	}
	return nil
}

func open(ns netns.NsHandle) (*nftables.Conn, error) {
	if !ns.IsOpen() {
		return nil, fmt.Errorf("nftredirect: namespace handle is closed")
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, fmt.Errorf("nftredirect: netlink connection to namespace %s: %w", ns, err)
	}
	return conn, nil
}
