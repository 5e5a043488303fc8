package nftredirect

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// ErrNoTable means the namespace has no table of that name.
var ErrNoTable = errors.New("nftredirect: no such table")

// Counters returns what each drop class has counted in ns's table (empty
// table: DefaultTable). Every class is present in the map; a class whose
// counter is missing from the table is an error, so a broken table never
// reads as "nothing dropped".
func Counters(ns netns.NsHandle, table string) (map[Class]Counts, error) {
	return counters(ns, table, false)
}

// TakeCounters is Counters that also sets every counter back to zero, in the
// same request (the kernel reads and resets each counter atomically), so
// consecutive takes add up to every drop exactly once: one take per policy
// phase gives that phase's drops.
func TakeCounters(ns netns.NsHandle, table string) (map[Class]Counts, error) {
	return counters(ns, table, true)
}

func counters(ns netns.NsHandle, table string, reset bool) (map[Class]Counts, error) {
	if table == "" {
		table = DefaultTable
	}
	conn, err := open(ns)
	if err != nil {
		return nil, err
	}
	read := readCounters
	if reset {
		read = resetCounters
	}
	counts, err := read(conn, table)
	if err != nil {
		return nil, fmt.Errorf("nftredirect: counters of table inet %s in namespace %s: %w", table, ns, err)
	}
	for _, c := range Classes {
		if _, ok := counts[c]; !ok {
			return nil, fmt.Errorf("nftredirect: counters of table inet %s in namespace %s: counter %q is missing", table, ns, c)
		}
	}
	return counts, nil
}

func readCounters(conn *nftables.Conn, table string) (map[Class]Counts, error) {
	return listCounters(conn, table, (*nftables.Conn).GetObjects)
}

func resetCounters(conn *nftables.Conn, table string) (map[Class]Counts, error) {
	return listCounters(conn, table, (*nftables.Conn).ResetObjects)
}

func listCounters(conn *nftables.Conn, table string, list func(*nftables.Conn, *nftables.Table) ([]nftables.Obj, error)) (map[Class]Counts, error) {
	t, err := findTable(conn, table)
	if err != nil {
		return nil, err
	}
	objs, err := list(conn, t)
	if err != nil {
		return nil, fmt.Errorf("list objects: %w", err)
	}
	counts := map[Class]Counts{}
	for _, o := range objs {
		if c, ok := o.(*nftables.CounterObj); ok {
			counts[Class(c.Name)] = Counts{Packets: c.Packets, Bytes: c.Bytes}
		}
	}
	return counts, nil
}

func findTable(conn *nftables.Conn, name string) (*nftables.Table, error) {
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: inet %s", ErrNoTable, name)
}
