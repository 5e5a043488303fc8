// Package dnstest serves DNS on loopback for tests: an upstream resolver the proxy's
// DNS server or its resolver asks.
package dnstest

import (
	"net"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// Serve runs handle over UDP and TCP on one loopback port until the test ends, and
// returns its address.
func Serve(t testing.TB, handle dns.HandlerFunc) string {
	t.Helper()
	pc, ln := listen(t)
	var wg sync.WaitGroup
	var srvs []*dns.Server
	for _, srv := range []*dns.Server{{PacketConn: pc, Net: "udp"}, {Listener: ln, Net: "tcp"}} {
		srv.Handler = handle
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		srvs = append(srvs, srv)
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.ActivateAndServe() }()
		<-started
	}
	t.Cleanup(func() {
		for _, s := range srvs {
			_ = s.Shutdown()
		}
		wg.Wait()
	})
	return pc.LocalAddr().String()
}

// listen binds UDP and TCP on one free loopback port; the TCP port of a free UDP port
// may be taken, so it tries a few.
func listen(t testing.TB) (net.PacketConn, net.Listener) {
	for range 10 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal("dnstest: no loopback port free for both UDP and TCP")
	return nil, nil
}

// AddrRecords is an answer of n A records of name (127.1.0.i), too long for 512 bytes
// when n > 30.
func AddrRecords(name string, n int) (rrs []dns.RR) {
	for i := range n {
		rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(127, 1, 0, byte(i))})
	}
	return rrs
}
