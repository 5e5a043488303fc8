package main

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestIPv4UDPChecksums(t *testing.T) {
	src := netip.MustParseAddrPort("10.1.2.3:5353")
	dst := netip.MustParseAddrPort("10.9.8.7:53")
	for _, payload := range [][]byte{nil, []byte("a"), []byte("odd length payload!"), make([]byte, 512)} {
		b := ipv4UDP(src, dst, payload)
		if got := checksum(b[:20], 0); got != 0 {
			t.Errorf("payload %d bytes: the IPv4 header does not sum to 0xffff (%#x)", len(payload), got)
		}
		u := b[20:]
		pseudo := uint32(17) + uint32(len(u)) + 0x0a01 + 0x0203 + 0x0a09 + 0x0807
		if got := checksum(u, pseudo); got != 0 {
			t.Errorf("payload %d bytes: the UDP datagram does not sum to 0xffff with its pseudo-header (%#x)", len(payload), got)
		}
		if binary.BigEndian.Uint16(b[2:]) != uint16(len(b)) || binary.BigEndian.Uint16(u[4:]) != uint16(len(u)) {
			t.Errorf("payload %d bytes: lengths %d and %d", len(payload), binary.BigEndian.Uint16(b[2:]), binary.BigEndian.Uint16(u[4:]))
		}
	}
}

// The query arrives from the address written in it, not the probe's own: on loopback,
// from 127.0.0.9, which nothing here uses.
func TestSpoofDNSArrivesFromTheWrittenSource(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a raw socket needs root (NET_RAW)")
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	r := spoofDNS(context.Background(), Check{Kind: "spoof", Target: pc.LocalAddr().String(), Source: "127.0.0.9:4444", QName: "spoofed.test"})
	if !r.Reachable {
		t.Fatalf("not sent: %s", r.Detail)
	}
	_ = pc.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	if from.String() != "127.0.0.9:4444" {
		t.Errorf("the datagram came from %s, want 127.0.0.9:4444", from)
	}
	var m dns.Msg
	if err := m.Unpack(buf[:n]); err != nil || len(m.Question) != 1 || m.Question[0].Name != "spoofed.test." {
		t.Errorf("the datagram is not a query for spoofed.test: %v %v", err, m.Question)
	}
}

func TestSpoofDNSRefusesBadAddresses(t *testing.T) {
	for _, c := range []Check{
		{Source: "not-an-address", Target: "127.0.0.1:53"},
		{Source: "[::1]:53", Target: "127.0.0.1:53"},
		{Source: "127.0.0.9:53", Target: "127.0.0.1"},
	} {
		if r := spoofDNS(context.Background(), c); r.Reachable {
			t.Errorf("source %q target %q: sent (%s)", c.Source, c.Target, r.Detail)
		}
	}
}
