package vethlink

import (
	"fmt"

	"github.com/vishvananda/netns"
)

// Remove deletes the pair (deleting one end deletes both, and the agent's
// default route through it). The agent is left with no default route at all:
// no egress, which is what every mode but public wants. A link of one of the
// names that is not a veth is not ours and is left alone, with an error.
func Remove(agentNS, sidecarNS netns.NsHandle, s Spec) error {
	p, err := openPair(agentNS, sidecarNS)
	if err != nil {
		return err
	}
	defer p.close()
	for _, end := range []struct {
		sd   side
		name string
	}{{p.agent, s.AgentName}, {p.sidecar, s.SidecarName}} {
		l, err := end.sd.link(end.name)
		if err != nil {
			return err
		}
		if l == nil {
			continue // already gone, or went with its peer
		}
		if l.Type() != "veth" {
			return fmt.Errorf("vethlink: link %s in %s is a %s, not a veth: not removing it", end.name, end.sd.label, l.Type())
		}
		if err := end.sd.h.LinkDel(l); err != nil {
			return fmt.Errorf("vethlink: delete link %s in %s: %w", end.name, end.sd.label, err)
		}
	}
	return nil
}
