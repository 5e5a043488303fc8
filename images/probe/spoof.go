package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/miekg/dns"
)

// spoofDNS sends one DNS query for c.QName to c.Target from c.Source, an address that
// need not be the probe's: the IPv4 and UDP headers are written by hand and sent on a
// raw socket (NET_RAW). What the datagram causes is for the caller to observe; the
// result says only whether it left.
func spoofDNS(_ context.Context, c Check) Result {
	src, err := netip.ParseAddrPort(c.Source)
	if err != nil || !src.Addr().Is4() {
		return Result{Detail: fmt.Sprintf("spoof: source %q is not an IPv4 address:port", c.Source)}
	}
	dst, err := netip.ParseAddrPort(c.Target)
	if err != nil || !dst.Addr().Is4() {
		return Result{Detail: fmt.Sprintf("spoof: target %q is not an IPv4 address:port", c.Target)}
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(c.QName), dns.TypeA)
	payload, err := m.Pack()
	if err != nil {
		return Result{Detail: "spoof: " + err.Error()}
	}
	// IPPROTO_RAW implies IP_HDRINCL: the kernel sends the header as written.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return Result{Detail: "spoof: raw socket: " + err.Error()}
	}
	defer syscall.Close(fd)
	if err := syscall.Sendto(fd, ipv4UDP(src, dst, payload), 0, &syscall.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
		return Result{Detail: "spoof: send: " + err.Error()}
	}
	return Result{Reachable: true, Detail: fmt.Sprintf("sent a query for %s to %s from %s", c.QName, dst, src)}
}

// ipv4UDP is an IPv4 packet carrying payload in a UDP datagram from src to dst, with
// both checksums.
func ipv4UDP(src, dst netip.AddrPort, payload []byte) []byte {
	const ipLen, udpLen = 20, 8
	b := make([]byte, ipLen+udpLen+len(payload))
	s, d := src.Addr().As4(), dst.Addr().As4()
	b[0] = 0x45 // version 4, 5 words of header
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8] = 64 // TTL
	b[9] = syscall.IPPROTO_UDP
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], checksum(b[:ipLen], 0))
	u := b[ipLen:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen+len(payload)))
	copy(u[udpLen:], payload)
	// The pseudo-header: addresses, protocol and UDP length.
	pseudo := uint32(syscall.IPPROTO_UDP) + uint32(udpLen+len(payload))
	for i := 0; i < 4; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(s[i:])) + uint32(binary.BigEndian.Uint16(d[i:]))
	}
	sum := checksum(u, pseudo)
	if sum == 0 {
		sum = 0xffff // 0 means "no checksum" in UDP over IPv4
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return b
}

// checksum is the Internet checksum (RFC 1071) of b, starting from the partial sum.
func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
