package dockerenv

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/network"
	"github.com/vishvananda/netlink"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// hostListener is a TCP service on every IPv4 address of this machine, the kind a
// sandbox must not reach past the sidecar; it records who connected.
type hostListener struct {
	ln   net.Listener
	port uint16
	wg   sync.WaitGroup
	mu   sync.Mutex
	from []string
}

func listenOnHost(t *testing.T) *hostListener {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatalf("host listener: %v", err)
	}
	l := &hostListener{ln: ln, port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.from = append(l.from, c.RemoteAddr().String())
			l.mu.Unlock()
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		l.wg.Wait()
	})
	return l
}

func (l *hostListener) accepted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.from...)
}

// gatewayOf reads a network's IPv4 gateway from docker inspect.
func gatewayOf(t *testing.T, name string) (netip.Addr, string) {
	t.Helper()
	ni, err := h.Docker.NetworkInspect(timeout(t, time.Minute), name, network.InspectOptions{})
	if err != nil {
		t.Fatalf("inspect network %s: %v", name, err)
	}
	for _, c := range ni.IPAM.Config {
		if gw, err := netip.ParseAddr(c.Gateway); err == nil && gw.Is4() {
			return gw, ni.ID
		}
	}
	t.Fatalf("network %s has no IPv4 gateway: %+v", name, ni.IPAM.Config)
	return netip.Addr{}, ""
}

// The task network's gateway address is on no host interface, so a service listening
// on 0.0.0.0 of the host is out of the sandbox's reach at <task gateway>:<port> in
// every mode (Docker's isolation rules filter forwarded traffic only, not traffic to
// the host itself). Public mode is the control: there the same listener answers at the
// egress network's gateway, so a probe that fails elsewhere is not a broken probe.
func TestSandboxCannotReachHostAtTaskGateway(t *testing.T) {
	h.Need(t)
	t.Parallel()
	l := listenOnHost(t)
	egressGW, _ := gatewayOf(t, h.EgressNetwork)
	p := h.Provider(t)
	for _, mode := range policy.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := timeout(t, 3*time.Minute)
			e := h.Open(t, p, "hostreach", byMode[mode])
			taskGW, netID := gatewayOf(t, e.Network())

			// Independently of the controller: the host's bridge for the task network
			// carries no IPv4 address. Docker names it br-<first 12 of the network ID>.
			if link, err := netlink.LinkByName("br-" + netID[:12]); err != nil {
				t.Errorf("host bridge of %s: %v", e.Network(), err)
			} else if addrs, err := netlink.AddrList(link, netlink.FAMILY_V4); err != nil || len(addrs) != 0 {
				t.Errorf("host bridge %s IPv4 addresses = %v (%v), want none", link.Attrs().Name, addrs, err)
			}

			atTaskGW := netip.AddrPortFrom(taskGW, l.port).String()
			checks := []harness.Check{
				{Name: "task-gw-tcp", Kind: "tcp", Target: atTaskGW, TimeoutMS: 1500},
				{Name: "task-gw-udp", Kind: "dns", Server: netip.AddrPortFrom(taskGW, 53).String(), QName: "hostreach.test", TimeoutMS: 1500},
			}
			if mode == policy.ModePublic {
				checks = append(checks, harness.Check{Name: "egress-gw-tcp", Kind: "tcp", Target: netip.AddrPortFrom(egressGW, l.port).String(), TimeoutMS: 1500})
			}
			res, err := h.ExecProbe(ctx, e.AgentContainer(), checks)
			if err != nil {
				t.Fatalf("probe in agent: %v", err)
			}
			for _, name := range []string{"task-gw-tcp", "task-gw-udp"} {
				if res[name].Name == "" || res[name].Reachable {
					t.Errorf("%s: %s from the agent: reachable=%t (%q), want unreachable", mode, name, res[name].Reachable, res[name].Detail)
				}
			}
			if mode == policy.ModePublic && !res["egress-gw-tcp"].Reachable {
				t.Errorf("public: the host listener at the egress gateway %s is not reachable (%q): the probe cannot tell", egressGW, res["egress-gw-tcp"].Detail)
			}
			ci, err := h.Docker.ContainerInspect(ctx, e.AgentContainer())
			if err != nil || ci.NetworkSettings.Networks[e.Network()] == nil {
				t.Fatalf("inspect agent: %v", err)
			}
			agentAddr := ci.NetworkSettings.Networks[e.Network()].IPAddress
			for _, from := range l.accepted() {
				if strings.HasPrefix(from, agentAddr+":") {
					t.Errorf("%s: the host listener accepted a connection from the agent's task address %s", mode, from)
				}
			}

			rep, err := e.Verify(ctx, docker.VerifyOptions{
				Allowed: allowedFor(mode), Blocked: blockedFor(mode), Outside: h.Fakenet, OutsidePort: l.port,
			})
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			gwRows := 0
			for _, r := range rep.Rows {
				if strings.Contains(r.Check, "task network gateway") {
					gwRows++
					if !r.OK || r.Observed != "fails" || !strings.HasPrefix(r.Target, taskGW.String()+":") {
						t.Errorf("%s: verify row %+v, want the task gateway %s observed failing", mode, r, taskGW)
					}
				}
			}
			if gwRows != 2 {
				t.Errorf("%s: verify has %d task gateway rows, want 2: %+v", mode, gwRows, rep.Rows)
			}
			for _, r := range rep.Rows {
				if !r.OK {
					t.Errorf("%s: verify row not as expected: %+v", mode, r)
				}
			}
		})
	}
}

// Through the sidecar the host is out of reach too. The egress network's gateway is the
// Docker host; a denylist lets every address but its list through, yet a CONNECT to
// <egress gateway>:<port> is refused (the gateways of the sidecar's routes are guarded
// as its own addresses are), and the host's listener never sees the sidecar. An
// allowlist naming that one address is the control: the listener then accepts the
// sidecar's connection, so the refusal is the guard's, not a dead path.
func TestSidecarRefusesTheHostAtItsGateway(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	l := listenOnHost(t)
	egressGW, _ := gatewayOf(t, h.EgressNetwork)
	e := h.Open(t, h.Provider(t), "hostgw", denylist)
	sc, err := h.Docker.ContainerInspect(ctx, e.SidecarContainer())
	if err != nil || sc.NetworkSettings.Networks[h.EgressNetwork] == nil {
		t.Fatalf("inspect sidecar: %v", err)
	}
	sidecarOut := sc.NetworkSettings.Networks[h.EgressNetwork].IPAddress
	fromSidecar := func() int {
		n := 0
		for _, from := range l.accepted() {
			if strings.HasPrefix(from, sidecarOut+":") {
				n++
			}
		}
		return n
	}
	target := netip.AddrPortFrom(egressGW, l.port).String()
	check := []harness.Check{{Name: "host", Kind: "proxy", Target: target, Proxy: netip.AddrPortFrom(e.SidecarAddr(), 3128).String()}}
	res, err := h.ExecProbe(ctx, e.AgentContainer(), check)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if r := res["host"]; r.Reachable || !strings.Contains(r.Detail, "403") {
		t.Errorf("denylist: CONNECT %s (the Docker host) through the sidecar: %s, want 403", target, r.Detail)
	}
	if n := fromSidecar(); n != 0 {
		t.Errorf("denylist: the host listener accepted %d connections from the sidecar (%s)", n, sidecarOut)
	}

	only := mustParse(`{"network_mode":"allowlist","allowed_hosts":["` + egressGW.String() + `"]}`)
	if _, err := e.Apply(ctx, only, controller.PhaseLabel{Phase: "control"}); err != nil {
		t.Fatalf("switch: %v", err)
	}
	if _, err := h.ExecProbe(ctx, e.AgentContainer(), check); err != nil {
		t.Fatalf("probe: %v", err)
	}
	// The listener records what it accepts on a goroutine of its own.
	for fromSidecar() == 0 {
		if ctx.Err() != nil {
			t.Fatalf("an allowlist naming %s: the host listener saw no connection from the sidecar (%s), so the refusal above proves nothing", egressGW, sidecarOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
