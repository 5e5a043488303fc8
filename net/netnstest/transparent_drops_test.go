package netnstest_test

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nsthread"
)

const (
	ipHeader  = 20
	udpHeader = 8
)

// expectDropsCounted sends UDP (QUIC's port included), ICMP, GRE and a
// spoofed datagram from the agent; each must land in its class's counter,
// packets and bytes (the IPv4 packet's length).
func (s *setup) expectDropsCounted(t *testing.T) {
	want := s.counters(t)
	add := func(c nftredirect.Class, packets, ipLen int) {
		n := want[c]
		n.Packets += uint64(packets)
		n.Bytes += uint64(packets * ipLen)
		want[c] = n
	}
	payload := []byte("0123456789")
	for _, dst := range []string{"198.51.100.9:9999", "198.51.100.9:9999", "198.51.100.9:9999", "203.0.113.7:443"} {
		s.sendUDP(t, "", dst, payload)
	}
	add(nftredirect.ClassUDP, 4, ipHeader+udpHeader+len(payload))

	echo := icmpEcho(payload)
	s.sendRaw(t, "ip4:icmp", "203.0.113.7", echo)
	add(nftredirect.ClassICMP, 1, ipHeader+len(echo))

	s.sendRaw(t, "ip4:47", "203.0.113.7", payload) // GRE
	add(nftredirect.ClassOther, 1, ipHeader+len(payload))

	s.addAgentLoopback(t, "169.254.77.5/32")
	s.sendUDP(t, "169.254.77.5:0", "198.51.100.9:9999", payload)
	add(nftredirect.ClassSpoofed, 1, ipHeader+udpHeader+len(payload))

	s.waitCounters(t, want)
}

func (s *setup) sendUDP(t *testing.T, local, dst string, payload []byte) {
	t.Helper()
	err := nsthread.Run(s.agent.Handle, func() error {
		laddr, err := net.ResolveUDPAddr("udp4", local)
		if err != nil {
			return err
		}
		raddr, err := net.ResolveUDPAddr("udp4", dst)
		if err != nil {
			return err
		}
		c, err := net.DialUDP("udp4", laddr, raddr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	})
	if err != nil {
		t.Fatalf("send UDP %s -> %s from the agent: %v", local, dst, err)
	}
}

func (s *setup) sendRaw(t *testing.T, network, dst string, payload []byte) {
	t.Helper()
	err := nsthread.Run(s.agent.Handle, func() error {
		c, err := net.ListenPacket(network, "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteTo(payload, &net.IPAddr{IP: net.ParseIP(dst)})
		return err
	})
	if err != nil {
		t.Fatalf("send %s to %s from the agent: %v", network, dst, err)
	}
}

// icmpEcho is an ICMP echo request (type 8) with its checksum.
func icmpEcho(payload []byte) []byte {
	b := append([]byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}, payload...)
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		v := uint32(b[i]) << 8
		if i+1 < len(b) {
			v |= uint32(b[i+1])
		}
		sum += v
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	cs := ^uint16(sum)
	b[2], b[3] = byte(cs>>8), byte(cs)
	return b
}

// addAgentLoopback gives the agent a second local address (on lo), from which
// a packet routed out of the link is spoofed as far as the sidecar is concerned.
func (s *setup) addAgentLoopback(t *testing.T, cidr string) {
	t.Helper()
	h, err := netlink.NewHandleAt(s.agent.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(cidr)
	if err := h.AddrAdd(lo, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
}

// expectNoIPv6: the link has no IPv6 address, so an IPv6 connect over it
// fails at once instead of reaching the sidecar.
func (s *setup) expectNoIPv6(t *testing.T) {
	start := time.Now()
	c, err := s.dial("tcp6", "[fe80::2%ce-a0]:22")
	if err == nil {
		c.Close()
		t.Fatal("an IPv6 connection over the link succeeded")
	}
	if isTimeout(err) || time.Since(start) > dialTimeout/2 {
		t.Fatalf("IPv6 dial failed after %v with %v; want an immediate failure", time.Since(start), err)
	}
	t.Logf("IPv6 dial over the link: %v", err)
}

// expectContained: forwarding is still off in the sidecar, its kernel has
// forwarded nothing, and each namespace has only loopback and its end.
func (s *setup) expectContained(t *testing.T) {
	if got := snmpIP(t, s.sidecar, "ForwDatagrams"); got != 0 {
		t.Errorf("sidecar forwarded %d datagrams, want 0", got)
	}
	if got := linkNames(t, s.agent); got != "lo,ce-a0" {
		t.Errorf("agent links = %s, want lo,ce-a0", got)
	}
	if got := linkNames(t, s.sidecar); got != "lo,ce-s0" {
		t.Errorf("sidecar links = %s, want lo,ce-s0", got)
	}
	for _, name := range []string{s.link.AgentName, s.link.SidecarName} {
		if _, err := netlink.LinkByName(name); err == nil {
			t.Errorf("link %s appeared in the host's namespace", name)
		}
	}
	// Forwarding off is also in Check; this repeats it after all the traffic.
	if p := s.problems(t); len(p) != 0 {
		t.Errorf("Check after traffic: %q", p)
	}
}

// snmpIP reads one field of the "Ip:" lines of /proc/net/snmp in ns. The
// thread-self path matters: /proc/self/net is the main thread's namespace.
func snmpIP(t *testing.T, ns netnstest.NS, field string) int {
	t.Helper()
	var lines [][]string
	err := nsthread.Run(ns.Handle, func() error {
		f, err := os.Open("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "Ip: ") {
				lines = append(lines, strings.Fields(sc.Text()))
			}
		}
		return sc.Err()
	})
	if err != nil || len(lines) != 2 {
		t.Fatalf("read snmp in %s: %v (%d Ip lines)", ns.Name, err, len(lines))
	}
	for i, name := range lines[0] {
		if name == field {
			v, err := strconv.Atoi(lines[1][i])
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s in snmp", field)
	return 0
}
