package egresslink

import (
	"fmt"
	"net/netip"

	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/vethlink"
)

// Spec is the link and the table of one environment.
type Spec struct {
	Link  vethlink.Spec
	Table nftredirect.Spec
}

// Slots is how many /30s ForSlot hands out: 169.254.0.0/16 without
// 169.254.0.0/24 and 169.254.255.0/24 (reserved by RFC 3927) and
// 169.254.169.0/24 (cloud metadata services live at 169.254.169.254).
const Slots = 253 * 64

// ForSlot is the spec of slot n: its /30 (agent .1, sidecar .2), link names
// ce-a<n> and ce-s<n> (at most 9 characters), the agent's extra route to the
// sidecar's address on the task network (so that every packet to the sidecar
// comes over the link, from the agent's end's address), and the table sending
// DNS to dns and other TCP to tcpPort.
func ForSlot(n int, sidecar netip.Addr, dns netip.AddrPort, tcpPort uint16) (Spec, error) {
	if n < 0 || n >= Slots {
		return Spec{}, fmt.Errorf("egresslink: slot %d: want 0..%d", n, Slots-1)
	}
	third := n/64 + 1
	if third >= 169 {
		third++
	}
	base := netip.AddrFrom4([4]byte{169, 254, byte(third), byte(n % 64 * 4)})
	agent, side := base.Next(), base.Next().Next()
	s := Spec{
		Link: vethlink.Spec{
			AgentName: fmt.Sprintf("ce-a%d", n), SidecarName: fmt.Sprintf("ce-s%d", n),
			AgentAddr: netip.PrefixFrom(agent, 30), SidecarAddr: netip.PrefixFrom(side, 30),
			Routes: []netip.Prefix{netip.PrefixFrom(sidecar, 32)},
		},
		Table: nftredirect.Spec{Interface: fmt.Sprintf("ce-s%d", n), AgentAddr: agent, TCPPort: tcpPort, DNS: dns},
	}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// Validate checks both halves and that they describe the same link.
func (s Spec) Validate() error {
	if err := s.Link.Validate(); err != nil {
		return err
	}
	if err := s.Table.Validate(); err != nil {
		return err
	}
	if s.Table.Interface != s.Link.SidecarName || s.Table.AgentAddr != s.Link.AgentAddr.Addr() {
		return fmt.Errorf("egresslink: table on %s from %v does not match link %s from %v",
			s.Table.Interface, s.Table.AgentAddr, s.Link.SidecarName, s.Link.AgentAddr.Addr())
	}
	return nil
}

// Gateway is the agent's one default gateway: the sidecar's end.
func (s Spec) Gateway() netip.Addr { return s.Link.SidecarAddr.Addr() }

// String names the link for reports: "ce-a3/ce-s3 169.254.1.12/30".
func (s Spec) String() string {
	return fmt.Sprintf("%s/%s %v", s.Link.AgentName, s.Link.SidecarName, s.Link.AgentAddr.Masked())
}
