package egresslink_test

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/net/egresslink"
	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nssysctl"
	"github.com/compass-egress/compass-egress/net/origdst"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sidecarTaskAddr stands for the sidecar's address on the task network, where
// the explicit proxy and the DNS server listen.
var sidecarTaskAddr = netip.MustParseAddr("10.213.0.2")

type env struct {
	agent, sidecar netnstest.NS
	pair           egresslink.Pair
	spec           egresslink.Spec
}

func newEnv(t *testing.T, slot int) *env {
	e := &env{agent: netnstest.New(t, "elagent"), sidecar: netnstest.New(t, "elsidecar")}
	e.pair = egresslink.Pair{Agent: e.agent.Handle, Sidecar: e.sidecar.Handle}
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		if err := nssysctl.Set(e.sidecar.Handle, key, "0"); err != nil {
			t.Fatal(err)
		}
	}
	// The task-network address, on the sidecar's loopback.
	h, err := netlink.NewHandleAt(e.sidecar.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: sidecarTaskAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	e.spec, err = egresslink.ForSlot(slot, sidecarTaskAddr, netip.AddrPortFrom(sidecarTaskAddr, 5353), 15001)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) problems(t *testing.T) []string {
	t.Helper()
	p, err := egresslink.Check(e.pair, e.spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// accept dials dst from the agent and returns the original destination of
// what ln accepted.
func (e *env) accept(t *testing.T, ln *net.TCPListener, dst string) string {
	t.Helper()
	c, err := netnstest.Dial(e.agent, "tcp4", dst, time.Second)
	if err != nil {
		t.Fatalf("dial %s from the agent: %v", dst, err)
	}
	defer c.Close()
	if err := ln.SetDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	sc, err := ln.AcceptTCP()
	if err != nil {
		t.Fatalf("the connection to %s did not arrive: %v", dst, err)
	}
	defer sc.Close()
	if from := sc.RemoteAddr().(*net.TCPAddr).IP.String(); from != e.spec.Link.AgentAddr.Addr().String() {
		t.Fatalf("connection to %s comes from %s, want the agent's end", dst, from)
	}
	got, err := origdst.Lookup(sc)
	if err != nil {
		return "not redirected"
	}
	return got.String()
}

func TestEnsureCheckRemove(t *testing.T) {
	e := newEnv(t, 300)
	if err := egresslink.Ensure(e.pair, e.spec); err != nil {
		t.Fatal(err)
	}
	if p := e.problems(t); len(p) != 0 {
		t.Fatalf("Check after Ensure: %q", p)
	}
	if err := egresslink.Ensure(e.pair, e.spec); err != nil {
		t.Fatalf("Ensure again: %v", err)
	}
	transparent := netnstest.ListenTCP(t, e.sidecar, "0.0.0.0:15001")
	explicit := netnstest.ListenTCP(t, e.sidecar, sidecarTaskAddr.String()+":3128")
	dnsTCP := netnstest.ListenTCP(t, e.sidecar, sidecarTaskAddr.String()+":5353")

	t.Run("tcp out goes to the transparent listener", func(t *testing.T) {
		if got := e.accept(t, transparent, "203.0.113.7:22"); got != "203.0.113.7:22" {
			t.Fatalf("original destination %s", got)
		}
	})
	t.Run("the explicit proxy at the sidecar's task address is reached over the link, not redirected", func(t *testing.T) {
		e.accept(t, explicit, sidecarTaskAddr.String()+":3128")
	})
	t.Run("dns to any address reaches the dns server", func(t *testing.T) {
		e.accept(t, dnsTCP, "192.0.2.53:53")
		e.accept(t, dnsTCP, sidecarTaskAddr.String()+":53")
	})
	t.Run("udp out is dropped, counted, and taken once", func(t *testing.T) {
		c, err := netnstest.Dial(e.agent, "udp4", "203.0.113.7:443", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("quic")); err != nil {
			t.Fatal(err)
		}
		took, err := egresslink.TakeCounters(e.sidecar.Handle, e.spec)
		if err != nil || took[nftredirect.ClassUDP].Packets != 1 {
			t.Fatalf("TakeCounters = %v, %v; want one udp packet", took, err)
		}
		again, err := egresslink.Counters(e.sidecar.Handle, e.spec)
		if err != nil || again[nftredirect.ClassUDP].Packets != 0 {
			t.Fatalf("Counters after a take = %v, %v; want zero", again, err)
		}
	})
	if err := egresslink.Remove(e.pair, e.spec); err != nil {
		t.Fatal(err)
	}
	p := strings.Join(e.problems(t), "\n")
	for _, want := range []string{"table inet compass_transparent is missing", "link ce-a300 is missing", "has no default route"} {
		if !strings.Contains(p, want) {
			t.Errorf("Check after Remove lacks %q:\n%s", want, p)
		}
	}
	if c, err := egresslink.Counters(e.sidecar.Handle, e.spec); c != nil || err != nil {
		t.Fatalf("Counters without a table = %v, %v; want nil, nil", c, err)
	}
	if err := egresslink.Remove(e.pair, e.spec); err != nil {
		t.Fatalf("Remove again: %v", err)
	}
}

// A link that fails leaves no table behind that this Ensure wrote.
func TestEnsureRollsBackTheTable(t *testing.T) {
	e := newEnv(t, 1)
	h, err := netlink.NewHandleAt(e.agent.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: e.spec.Link.AgentName}, PeerName: "other"}); err != nil {
		t.Fatal(err)
	}
	if err := egresslink.Ensure(e.pair, e.spec); err == nil || !strings.Contains(err.Error(), "not touching it") {
		t.Fatalf("Ensure beside a foreign link named %s = %v, want a refusal", e.spec.Link.AgentName, err)
	}
	if c, err := egresslink.Counters(e.sidecar.Handle, e.spec); c != nil || err != nil {
		t.Fatalf("table after the failed Ensure: %v, %v; want none", c, err)
	}
}

func TestOpenPIDRefusesOwnNamespace(t *testing.T) {
	netnstest.RequireRoot(t)
	if _, err := egresslink.OpenPID(os.Getpid()); err == nil || !strings.Contains(err.Error(), "controller's own network namespace") {
		t.Fatalf("OpenPID(self) = %v, want a refusal", err)
	}
}

func TestSelfTest(t *testing.T) {
	netnstest.RequireRoot(t)
	if err := egresslink.SelfTest(); err != nil {
		t.Fatal(err)
	}
}
