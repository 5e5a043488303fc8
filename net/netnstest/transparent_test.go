package netnstest_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nssysctl"
	"github.com/compass-egress/compass-egress/net/origdst"
	"github.com/compass-egress/compass-egress/net/vethlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup is one agent and its sidecar, wired as the controller will wire them.
type setup struct {
	agent, sidecar netnstest.NS
	link           vethlink.Spec
	table          nftredirect.Spec
	tcp, dnsTCP    *net.TCPListener
	dnsUDP         *net.UDPConn
}

const dialTimeout = time.Second

func newSetup(t *testing.T) *setup {
	s := &setup{
		agent:   netnstest.New(t, "agent"),
		sidecar: netnstest.New(t, "sidecar"),
		link: vethlink.Spec{
			AgentName: "ce-a0", SidecarName: "ce-s0",
			AgentAddr:   netip.MustParsePrefix("169.254.77.1/30"),
			SidecarAddr: netip.MustParsePrefix("169.254.77.2/30"),
		},
	}
	s.table = nftredirect.Spec{
		Interface: s.link.SidecarName, AgentAddr: s.link.AgentAddr.Addr(),
		TCPPort: 15001, DNS: netip.AddrPortFrom(s.link.SidecarAddr.Addr(), 15053),
	}
	// A new namespace here starts with forwarding on; the sidecar runs with it off.
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		if err := nssysctl.Set(s.sidecar.Handle, key, "0"); err != nil {
			t.Fatal(err)
		}
	}
	s.ensure(t)
	s.tcp = netnstest.ListenTCP(t, s.sidecar, "0.0.0.0:15001")
	s.dnsTCP = netnstest.ListenTCP(t, s.sidecar, "0.0.0.0:15053")
	s.dnsUDP = netnstest.ListenUDP(t, s.sidecar, "0.0.0.0:15053")
	return s
}

func (s *setup) ensure(t *testing.T) (tableChanged bool) {
	t.Helper()
	if err := vethlink.Ensure(s.agent.Handle, s.sidecar.Handle, s.link); err != nil {
		t.Fatal(err)
	}
	changed, err := nftredirect.Ensure(s.sidecar.Handle, s.table)
	if err != nil {
		t.Fatal(err)
	}
	return changed
}

func (s *setup) problems(t *testing.T) []string {
	t.Helper()
	link, err := vethlink.Check(s.agent.Handle, s.sidecar.Handle, s.link)
	if err != nil {
		t.Fatal(err)
	}
	table, err := nftredirect.Check(s.sidecar.Handle, s.table)
	if err != nil {
		t.Fatal(err)
	}
	return append(link, table...)
}

// TestTransparentPath builds the whole path between two namespaces and sends
// each class of traffic through it.
func TestTransparentPath(t *testing.T) {
	s := newSetup(t)
	if p := s.problems(t); len(p) != 0 {
		t.Fatalf("Check after Ensure: %q", p)
	}
	t.Run("tcp to any address and port reaches the listener with its original destination", func(t *testing.T) {
		s.expectRedirected(t, s.tcp, "203.0.113.7:22")
		s.expectRedirected(t, s.tcp, "198.51.100.20:443")
	})
	t.Run("dns to any address reaches the dns port", func(t *testing.T) {
		s.expectDNSOverUDP(t, "192.0.2.53:53")
		s.expectRedirected(t, s.dnsTCP, "192.0.2.53:53")
	})
	t.Run("other traffic is dropped and counted", func(t *testing.T) { s.expectDropsCounted(t) })
	t.Run("no ipv6 on the link", func(t *testing.T) { s.expectNoIPv6(t) })
	t.Run("ensure again changes nothing", func(t *testing.T) {
		before := s.counters(t)
		if s.ensure(t) {
			t.Fatal("nftredirect.Ensure on a matching table replaced it")
		}
		if after := s.counters(t); after[nftredirect.ClassUDP] != before[nftredirect.ClassUDP] {
			t.Fatalf("counters changed across a no-op Ensure: %v -> %v", before, after)
		}
	})
	t.Run("forwarding stayed off and nothing left the pair", func(t *testing.T) { s.expectContained(t) })
	t.Run("a deleted rule is reported, fails closed and is repaired", func(t *testing.T) { s.deletedRule(t) })
	t.Run("a downed link is reported, fails closed and is repaired", func(t *testing.T) { s.downedLink(t) })
	t.Run("remove leaves neither namespace with the link or the table", func(t *testing.T) { s.remove(t) })
}

func (s *setup) dial(network, addr string) (net.Conn, error) {
	return netnstest.Dial(s.agent, network, addr, dialTimeout)
}

// expectRedirected dials dst from the agent, accepts on ln and checks the
// original destination and that bytes flow both ways.
func (s *setup) expectRedirected(t *testing.T, ln *net.TCPListener, dst string) {
	t.Helper()
	c, err := s.dial("tcp4", dst)
	if err != nil {
		t.Fatalf("dial %s from the agent: %v", dst, err)
	}
	defer c.Close()
	if err := ln.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
		t.Fatal(err)
	}
	sc, err := ln.AcceptTCP()
	if err != nil {
		t.Fatalf("accept the connection to %s: %v", dst, err)
	}
	defer sc.Close()
	got, err := origdst.Lookup(sc)
	if err != nil || got.String() != dst {
		t.Fatalf("origdst.Lookup = %v, %v; want %s", got, err, dst)
	}
	if from := sc.RemoteAddr().(*net.TCPAddr).IP.String(); from != "169.254.77.1" {
		t.Fatalf("connection comes from %s, want the agent's end 169.254.77.1", from)
	}
	if _, err := sc.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if err := c.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("agent read %q, %v; want the listener's bytes", buf, err)
	}
}

// expectDNSOverUDP sends a datagram to dst:53; the DNS port must get it from
// the agent, and the agent must get the answer back from dst.
func (s *setup) expectDNSOverUDP(t *testing.T, dst string) {
	t.Helper()
	c, err := s.dial("udp4", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if err := s.dnsUDP.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
		t.Fatal(err)
	}
	n, from, err := s.dnsUDP.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "query" || from.IP.String() != "169.254.77.1" {
		t.Fatalf("DNS port read %q from %v, %v; want \"query\" from 169.254.77.1", buf[:n], from, err)
	}
	if _, err := s.dnsUDP.WriteToUDP([]byte("answer"), from); err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
		t.Fatal(err)
	}
	n, err = c.Read(buf)
	if err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("agent read %q, %v; want the answer from %s", buf[:n], err, dst)
	}
}

func (s *setup) counters(t *testing.T) map[nftredirect.Class]nftredirect.Counts {
	t.Helper()
	c, err := nftredirect.Counters(s.sidecar.Handle, s.table.Table)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitCounters polls until the counters equal want (packets arrive
// asynchronously) and fails with the last reading otherwise.
func (s *setup) waitCounters(t *testing.T, want map[nftredirect.Class]nftredirect.Counts) {
	t.Helper()
	var got map[nftredirect.Class]nftredirect.Counts
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = s.counters(t); equalCounts(got, want) {
			return
		}
	}
	t.Fatalf("counters = %v, want %v", got, want)
}

func equalCounts(a, b map[nftredirect.Class]nftredirect.Counts) bool {
	for _, c := range nftredirect.Classes {
		if a[c] != b[c] {
			return false
		}
	}
	return true
}

// isTimeout says whether err is a dial that got no answer: what a dropped SYN
// looks like to the agent.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func linkNames(t *testing.T, ns netnstest.NS) string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return strings.Join(names, ",")
}

func tableNames(t *testing.T, ns netnstest.NS) string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tab := range tables {
		names = append(names, tab.Name)
	}
	return strings.Join(names, ",")
}

func vethlinkRemove(s *setup) error {
	return vethlink.Remove(s.agent.Handle, s.sidecar.Handle, s.link)
}
