package vethlink

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nsthread"
)

// side is one namespace of the pair: a netlink handle bound to it, and a
// label for errors.
type side struct {
	h     *netlink.Handle
	ns    netns.NsHandle
	label string // "agent namespace NS(fd: dev, ino)"
}

type pair struct{ agent, sidecar side }

func openPair(agentNS, sidecarNS netns.NsHandle) (*pair, error) {
	a, err := openSide(agentNS, "agent")
	if err != nil {
		return nil, err
	}
	s, err := openSide(sidecarNS, "sidecar")
	if err != nil {
		a.h.Close()
		return nil, err
	}
	return &pair{agent: a, sidecar: s}, nil
}

func openSide(ns netns.NsHandle, role string) (side, error) {
	label := fmt.Sprintf("%s namespace %s", role, ns)
	if !ns.IsOpen() {
		return side{}, fmt.Errorf("vethlink: %s namespace handle is closed", role)
	}
	var h *netlink.Handle
	err := nsthread.Discarded(func() (err error) {
		h, err = netlink.NewHandleAt(ns)
		return err
	})
	if err != nil {
		return side{}, fmt.Errorf("vethlink: netlink handle in %s: %w", label, err)
	}
	return side{h: h, ns: ns, label: label}, nil
}

func (p *pair) close() {
	p.agent.h.Close()
	p.sidecar.h.Close()
}

// link returns the link named name, or nil if there is none.
func (s side) link(name string) (netlink.Link, error) {
	l, err := s.h.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vethlink: look up link %s in %s: %w", name, s.label, err)
	}
	return l, nil
}

// peered says whether a (in the agent's namespace) and s (in the sidecar's)
// are the two ends of one veth pair, or why not.
func (p *pair) peered(a, s netlink.Link) string {
	if a.Type() != "veth" {
		return fmt.Sprintf("link %s in %s is a %s, not a veth", a.Attrs().Name, p.agent.label, a.Type())
	}
	if s.Type() != "veth" {
		return fmt.Sprintf("link %s in %s is a %s, not a veth", s.Attrs().Name, p.sidecar.label, s.Type())
	}
	nsid, err := p.agent.h.GetNetNsIdByFd(int(p.sidecar.ns))
	if err != nil || nsid < 0 || a.Attrs().NetNsID != nsid || a.Attrs().ParentIndex != s.Attrs().Index {
		return fmt.Sprintf("link %s in %s is not the peer of link %s in %s",
			a.Attrs().Name, p.agent.label, s.Attrs().Name, p.sidecar.label)
	}
	return ""
}
