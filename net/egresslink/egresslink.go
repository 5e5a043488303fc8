package egresslink

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/vethlink"
)

// Pair is the agent's and the sidecar's network namespaces.
type Pair struct{ Agent, Sidecar netns.NsHandle }

// OpenPIDs opens the namespaces of two processes, refusing the caller's own
// namespace (a pid reused by a host process) and one shared by both.
func OpenPIDs(agentPID, sidecarPID int) (Pair, error) {
	a, err := OpenPID(agentPID)
	if err != nil {
		return Pair{}, err
	}
	s, err := OpenPID(sidecarPID)
	if err != nil {
		a.Close()
		return Pair{}, err
	}
	if a.Equal(s) {
		a.Close()
		s.Close()
		return Pair{}, fmt.Errorf("egresslink: pids %d and %d share one network namespace: no link between an agent and its sidecar", agentPID, sidecarPID)
	}
	return Pair{Agent: a, Sidecar: s}, nil
}

// OpenPID opens /proc/<pid>/ns/net, refusing the caller's own namespace.
func OpenPID(pid int) (netns.NsHandle, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return ns, fmt.Errorf("netns: open /proc/%d/ns/net: %w", pid, err)
	}
	self, err := netns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		ns.Close()
		return netns.None(), fmt.Errorf("netns: open /proc/self/ns/net: %w", err)
	}
	defer self.Close()
	if ns.Equal(self) {
		ns.Close()
		return netns.None(), fmt.Errorf("netns: /proc/%d/ns/net is the controller's own network namespace, not a container's: not touched", pid)
	}
	return ns, nil
}

// Close closes both handles.
func (p Pair) Close() {
	p.Agent.Close()
	p.Sidecar.Close()
}

// Ensure writes the table, then the link. If the link fails and this call
// created the table, the table goes again (CNI style: an error leaves nothing
// new behind); vethlink.Ensure rolls back a pair it created itself.
func Ensure(p Pair, s Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	_, cerr := nftredirect.Counters(p.Sidecar, s.Table.Table)
	created := errors.Is(cerr, nftredirect.ErrNoTable)
	if _, err := nftredirect.Ensure(p.Sidecar, s.Table); err != nil {
		return err
	}
	if err := vethlink.Ensure(p.Agent, p.Sidecar, s.Link); err != nil {
		if created {
			if rerr := nftredirect.Remove(p.Sidecar, s.Table.Table); rerr != nil {
				err = errors.Join(err, fmt.Errorf("egresslink: roll back the table: %w", rerr))
			}
		}
		return err
	}
	return nil
}

// Check returns the problems of the table and of the link (see their Check);
// none means the path is as Ensure leaves it.
func Check(p Pair, s Spec) ([]string, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	table, err := nftredirect.Check(p.Sidecar, s.Table)
	if err != nil {
		return nil, err
	}
	link, err := vethlink.Check(p.Agent, p.Sidecar, s.Link)
	if err != nil {
		return nil, err
	}
	return append(table, link...), nil
}

// Counters reads the drop counters; nil without an error means there is no table.
func Counters(sidecar netns.NsHandle, s Spec) (map[nftredirect.Class]nftredirect.Counts, error) {
	return noTableIsNil(nftredirect.Counters(sidecar, s.Table.Table))
}

// TakeCounters reads the drop counters and sets them to zero (see
// nftredirect.TakeCounters); nil without an error means there is no table.
func TakeCounters(sidecar netns.NsHandle, s Spec) (map[nftredirect.Class]nftredirect.Counts, error) {
	return noTableIsNil(nftredirect.TakeCounters(sidecar, s.Table.Table))
}

func noTableIsNil(c map[nftredirect.Class]nftredirect.Counts, err error) (map[nftredirect.Class]nftredirect.Counts, error) {
	if errors.Is(err, nftredirect.ErrNoTable) {
		return nil, nil
	}
	return c, err
}

// Remove deletes the link (and the agent's default route through it), then the
// table. Either may already be gone.
func Remove(p Pair, s Spec) error {
	if err := vethlink.Remove(p.Agent, p.Sidecar, s.Link); err != nil {
		return err
	}
	return nftredirect.Remove(p.Sidecar, s.Table.Table)
}
