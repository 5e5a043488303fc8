package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/net/egresslink"
	"github.com/compass-egress/compass-egress/net/nftredirect"
)

// transparentLink is the environment's transparent path in the kernel: the sidecar's
// table and the agent's link to it (net/egresslink), by the containers' pids.
type transparentLink interface {
	// Ensure writes the table, then the link; Check returns what differs from s.
	Ensure(agentPID, sidecarPID int, s egresslink.Spec) error
	Check(agentPID, sidecarPID int, s egresslink.Spec) ([]string, error)
	// Counters reads the drop counters; TakeCounters also zeroes them. Both are nil
	// when the sidecar has no table.
	Counters(sidecarPID int, s egresslink.Spec) (controller.Drops, error)
	TakeCounters(sidecarPID int, s egresslink.Spec) (controller.Drops, error)
	// Remove deletes the link (and the agent's default route through it), then the table.
	Remove(agentPID, sidecarPID int, s egresslink.Spec) error
	// SelfTest builds, checks and removes a path between throw-away namespaces.
	SelfTest() error
}

// kernelLink is transparentLink on this host's kernel.
type kernelLink struct{}

func (kernelLink) Ensure(agentPID, sidecarPID int, s egresslink.Spec) error {
	return withPair(agentPID, sidecarPID, func(p egresslink.Pair) error { return egresslink.Ensure(p, s) })
}

func (kernelLink) Check(agentPID, sidecarPID int, s egresslink.Spec) (problems []string, err error) {
	err = withPair(agentPID, sidecarPID, func(p egresslink.Pair) error {
		problems, err = egresslink.Check(p, s)
		return err
	})
	return problems, err
}

func (kernelLink) Remove(agentPID, sidecarPID int, s egresslink.Spec) error {
	return withPair(agentPID, sidecarPID, func(p egresslink.Pair) error { return egresslink.Remove(p, s) })
}

func (kernelLink) Counters(sidecarPID int, s egresslink.Spec) (controller.Drops, error) {
	return sidecarCounters(sidecarPID, s, egresslink.Counters)
}

func (kernelLink) TakeCounters(sidecarPID int, s egresslink.Spec) (controller.Drops, error) {
	return sidecarCounters(sidecarPID, s, egresslink.TakeCounters)
}

func (kernelLink) SelfTest() error { return egresslink.SelfTest() }

func withPair(agentPID, sidecarPID int, f func(egresslink.Pair) error) error {
	p, err := egresslink.OpenPIDs(agentPID, sidecarPID)
	if err != nil {
		return err
	}
	defer p.Close()
	return f(p)
}

func sidecarCounters(pid int, s egresslink.Spec, read func(netns.NsHandle, egresslink.Spec) (map[nftredirect.Class]nftredirect.Counts, error)) (controller.Drops, error) {
	ns, err := egresslink.OpenPID(pid)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	c, err := read(ns, s)
	if err != nil || c == nil {
		return nil, err
	}
	d := controller.Drops{}
	for class, n := range c {
		d[string(class)] = controller.DropCount{Packets: n.Packets, Bytes: n.Bytes}
	}
	return d, nil
}

// linkState is link.json in the environment's state directory: its slot of
// egresslink.ForSlot.
type linkState struct {
	Slot int `json:"slot"`
}

// loadLink sets e.link from the slot recorded in the state directory, recording it
// first if there is none. The slot is the index of the task subnet in the pool: Docker
// refuses overlapping networks, so no two environments of one pool share a slot, however
// many open at once. Recorded, it stays the environment's under a process configured
// with another pool. (Slots only name things inside the environment's two namespaces:
// environments of two pools that share one clash in nothing.)
func (e *Env) loadLink() error {
	path := filepath.Join(string(e.dir), "link.json")
	var st linkState
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("state: %s: %w", path, err)
		}
	case errors.Is(err, os.ErrNotExist):
		if !e.p.cfg.Pool.Contains(e.plan.Subnet.Addr()) {
			return fmt.Errorf("docker: task subnet %v is outside the pool %v: no transparent link slot for it", e.plan.Subnet, e.p.cfg.Pool)
		}
		st.Slot = subnetIndex(e.p.cfg.Pool, e.plan.Subnet)
		if b, err = json.Marshal(st); err == nil {
			err = os.WriteFile(path, b, 0o640)
		}
		if err != nil {
			return fmt.Errorf("state: %w", err)
		}
	default:
		return fmt.Errorf("state: %w", err)
	}
	e.link, err = egresslink.ForSlot(st.Slot, e.plan.Sidecar, netip.AddrPortFrom(e.plan.Sidecar, dnsPort), transparentPort)
	return err
}

// subnetIndex is n where sub is nthSubnet(pool, sub.Bits(), n).
func subnetIndex(pool, sub netip.Prefix) int {
	a, b := pool.Addr().As4(), sub.Addr().As4()
	off := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) -
		(uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]))
	return int(off >> (32 - sub.Bits()))
}

// sidecarPID is the running sidecar's pid, whose namespace holds the table.
func (e *Env) sidecarPID(ctx context.Context) (int, error) {
	sc, err := e.p.api.ContainerInspect(ctx, e.names.Sidecar)
	if err != nil {
		return 0, fmt.Errorf("docker: inspect sidecar %s: %w", e.names.Sidecar, err)
	}
	if sc.State == nil || !sc.State.Running || sc.State.Pid == 0 {
		return 0, fmt.Errorf("docker: sidecar %s is not running: no transparent path", e.names.Sidecar)
	}
	return sc.State.Pid, nil
}

// ensureLink takes the drop counters of the phase the switch ends, then ensures the
// table and the link (a restarted agent or sidecar gets them anew) and checks them: the
// agent's only default route is then the link's.
func (e *Env) ensureLink(ctx context.Context, agentPID int, r *SwitchReport) error {
	scPID, err := e.sidecarPID(ctx)
	if err != nil {
		return err
	}
	if r.PreviousDropped, err = e.p.link.TakeCounters(scPID, e.link); err != nil {
		return fmt.Errorf("docker: transparent path %s: %w", e.link, err)
	}
	if err := e.p.link.Ensure(agentPID, scPID, e.link); err != nil {
		return fmt.Errorf("docker: transparent path %s: %w", e.link, err)
	}
	r.Changes = append(r.Changes, "transparent table ensured in the sidecar",
		fmt.Sprintf("transparent link %s ensured: the agent's only default route is via %v", e.link, e.link.Gateway()))
	problems, err := e.p.link.Check(agentPID, scPID, e.link)
	if err == nil && len(problems) > 0 {
		err = errors.New(strings.Join(problems, "; "))
	}
	if err != nil {
		return fmt.Errorf("docker: transparent path %s after ensure: %w", e.link, err)
	}
	return nil
}

// removeLink takes the drop counters of the phase the switch ends, then removes the
// link and the table (nothing to remove is fine).
func (e *Env) removeLink(ctx context.Context, agentPID int, r *SwitchReport) error {
	scPID, err := e.sidecarPID(ctx)
	if err != nil {
		return err
	}
	if r.PreviousDropped, err = e.p.link.TakeCounters(scPID, e.link); err != nil {
		return fmt.Errorf("docker: transparent path %s: %w", e.link, err)
	}
	if err := e.p.link.Remove(agentPID, scPID, e.link); err != nil {
		return fmt.Errorf("docker: transparent path %s: %w", e.link, err)
	}
	if r.PreviousDropped != nil {
		r.Changes = append(r.Changes, fmt.Sprintf("transparent link %s and table removed", e.link))
	}
	return nil
}

// TakeDropped takes the drop counters of the phase in force, which the close is about
// to end (controller.DropCounter); nothing when the phase has no transparent path.
func (e *Env) TakeDropped(ctx context.Context) (controller.Drops, error) {
	scPID, err := e.sidecarPID(ctx)
	if err != nil {
		return nil, err
	}
	d, err := e.p.link.TakeCounters(scPID, e.link)
	if err != nil {
		return nil, fmt.Errorf("docker: transparent path %s: %w", e.link, err)
	}
	return d, nil
}
