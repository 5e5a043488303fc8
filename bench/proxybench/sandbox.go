package proxybench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nssysctl"
	"github.com/compass-egress/compass-egress/net/nsthread"
	"github.com/compass-egress/compass-egress/net/vethlink"
)

// The sandbox's wiring: agent ─veth─ sidecar ─veth─ outside, as the controller wires a
// sandbox's agent to its sidecar (net/vethlink, net/nftredirect). Every address exists
// only inside the benchmark's namespaces: a link-local /30 between agent and sidecar, and
// a documentation /30 (RFC 5737) between sidecar and outside, where the upstream listens.
var (
	agentLink = vethlink.Spec{AgentName: "pb-agent", SidecarName: "pb-sidecar",
		AgentAddr: netip.MustParsePrefix("169.254.77.1/30"), SidecarAddr: netip.MustParsePrefix("169.254.77.2/30")}
	// vethlink's "agent" end is the outside here: its default route, via the sidecar,
	// carries the upstream's answers back.
	outsideLink = vethlink.Spec{AgentName: "pb-outside", SidecarName: "pb-out",
		AgentAddr: netip.MustParsePrefix("192.0.2.1/30"), SidecarAddr: netip.MustParsePrefix("192.0.2.2/30")}
)

const (
	explicitPort    = 3128
	transparentPort = 15001 // as the controller passes it
	dnsPort         = 15053 // nothing listens: destinations are address literals
	// refusedAddr is an outside address the sandbox's policy does not allow.
	refusedAddr = "198.51.100.1"
)

// sandboxPolicy allows the upstream's address alone: the transparent path exists in the
// restricted modes, and a refusal check shows the policy is in force.
var sandboxPolicy = []byte(`{"network_mode":"allowlist","allowed_hosts":["` + outsideLink.AgentAddr.Addr().String() + `/32"]}`)

// Sandbox is one compass-proxy running in a sidecar namespace, reached from an agent
// namespace over the transparent path (any outside address, redirected by nftables)
// and over the explicit one (CONNECT to the sidecar's address), with the upstream in a
// third namespace.
type Sandbox struct {
	agent, sidecar, outside namespace
	Upstream                *Upstream
	proxy                   *Process
}

// StartSandbox sweeps the namespaces of killed earlier runs, builds the sandbox and
// starts compass-proxy (binary bin, further flags extra) in it. Close undoes it all.
func StartSandbox(bin, dir string, extra ...string) (s *Sandbox, err error) {
	if _, err := sweepNamespaces(); err != nil {
		return nil, err
	}
	s = &Sandbox{}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
			s = nil
		}
	}()
	for _, ns := range []struct {
		role string
		to   *namespace
	}{{"agent", &s.agent}, {"sidecar", &s.sidecar}, {"outside", &s.outside}} {
		if *ns.to, err = createNamespace(ns.role); err != nil {
			return s, err
		}
	}
	if err := s.wire(); err != nil {
		return s, err
	}
	s.Upstream, err = startUpstream(func() (ln net.Listener, err error) {
		err = nsthread.Run(s.outside.Handle, func() (err error) {
			ln, err = listenUpstream(outsideLink.AgentAddr.Addr().String())
			return err
		})
		return ln, err
	})
	if err != nil {
		return s, err
	}
	addr := netip.AddrPortFrom(agentLink.SidecarAddr.Addr(), explicitPort).String()
	argv, err := compassArgv("compass-sandbox", bin, dir, addr, sandboxPolicy)
	if err != nil {
		return s, err
	}
	argv = append([]string{"ip", "netns", "exec", s.sidecar.Name}, append(argv,
		"--transparent-listen", ":"+strconv.Itoa(transparentPort))...)
	if s.proxy, err = startProcess(s.client(), "compass-sandbox", dir, addr, 60*time.Second, append(argv, extra...)...); err != nil {
		return s, err
	}
	return s, s.checkPaths()
}

// wire turns forwarding off in the sidecar (as it runs in a sandbox: a packet no rule
// redirects goes nowhere), links the namespaces and writes the redirect table.
func (s *Sandbox) wire() error {
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		if err := nssysctl.Set(s.sidecar.Handle, key, "0"); err != nil {
			return fmt.Errorf("proxybench: sidecar %s: %w", key, err)
		}
	}
	if err := vethlink.Ensure(s.agent.Handle, s.sidecar.Handle, agentLink); err != nil {
		return fmt.Errorf("proxybench: %w", err)
	}
	if err := vethlink.Ensure(s.outside.Handle, s.sidecar.Handle, outsideLink); err != nil {
		return fmt.Errorf("proxybench: %w", err)
	}
	_, err := nftredirect.Ensure(s.sidecar.Handle, nftredirect.Spec{
		Interface: agentLink.SidecarName, AgentAddr: agentLink.AgentAddr.Addr(), TCPPort: transparentPort,
		DNS: netip.AddrPortFrom(agentLink.SidecarAddr.Addr(), dnsPort)})
	if err != nil {
		return fmt.Errorf("proxybench: %w", err)
	}
	return nil
}

// client is a target whose connections start in the agent's namespace.
func (s *Sandbox) client() Target {
	return Target{Enter: func(fn func() error) error { return nsthread.Run(s.agent.Handle, fn) }}
}

// Targets are the explicit and the transparent path, named explicit and transparent:
// the same client namespace, proxy process and upstream; only the path differs.
func (s *Sandbox) Targets(explicit, transparent string) (Target, Target) {
	t := s.client()
	t.PIDs = func() []int { return []int{s.proxy.PID()} }
	t.Upstream = s.Upstream
	e, tr := t, t
	e.Name, e.Proxy = explicit, s.proxy.Addr
	tr.Name = transparent
	return e, tr
}

// checkPaths makes sure each path measures what it claims to: a set-up through either
// reaches the upstream, and a transparent connection to an address the policy leaves
// out is refused (so the proxy decides what the redirect brings it).
func (s *Sandbox) checkPaths() error {
	e, tr := s.Targets("explicit", "transparent")
	lim := Limits{Concurrency: 1, Duration: time.Minute, Setups: 1}
	for _, t := range []Target{e, tr} {
		if r := Setups(t, s.Upstream.StreamAddr(), lim); r.Ops != 1 {
			return fmt.Errorf("proxybench: sandbox: no set-up through the %s path to %s", t.Name, s.Upstream.StreamAddr())
		}
	}
	_, port, _ := net.SplitHostPort(s.Upstream.StreamAddr())
	refused := net.JoinHostPort(refusedAddr, port)
	return tr.run(func() error {
		c, r, err := dialTunnel(tr, refused)
		if err != nil {
			return fmt.Errorf("proxybench: sandbox: transparent dial of %s: %w", refused, err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(ioTimeout))
		c.Write([]byte{modeEcho})
		if b, err := r.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			return fmt.Errorf("proxybench: sandbox: the transparent path let %s through (read %q, %v): the policy is not in force", refused, b, err)
		}
		return nil
	})
}

// Close stops the proxy and the upstream and deletes the namespaces.
func (s *Sandbox) Close() error {
	var errs []error
	if s.proxy != nil {
		errs = append(errs, s.proxy.Stop())
		s.proxy = nil
	}
	if s.Upstream != nil {
		s.Upstream.Close()
		s.Upstream = nil
	}
	for _, ns := range []*namespace{&s.agent, &s.sidecar, &s.outside} {
		if ns.Name != "" {
			errs = append(errs, ns.delete())
			*ns = namespace{}
		}
	}
	return errors.Join(errs...)
}
