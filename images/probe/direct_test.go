package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/internal/testutil"
)

// sidecarDNS answers like the sidecar's DNS under a restrictive policy: ok.test is
// 127.0.0.1; every other name is REFUSED with the sidecar's Extended DNS Error.
func sidecarDNS(t *testing.T) string {
	t.Helper()
	udp, _ := testutil.ServeDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Name == "ok.test." {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "ok.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(127, 0, 0, 1)})
		} else {
			m.Rcode = dns.RcodeRefused
			if q.IsEdns0() != nil {
				m.SetEdns0(dns.DefaultMsgSize, false)
				opt := m.IsEdns0()
				opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeBlocked, ExtraText: "compass-egress: not-allowlisted"})
			}
		}
		_ = w.WriteMsg(m)
	}))
	return udp
}

// TestDirectChecks: the checks of a client that ignores the proxy tell a destination's
// answer from the transparent sidecar's refusals (a 403 with X-Compass-Egress, a TLS
// alert or close, a close without a byte, a REFUSED with its EDE).
func TestDirectChecks(t *testing.T) {
	resolver := sidecarDNS(t)
	cert := testutil.SelfSigned(t, "ok.test")
	tlsServer := serveConns(t, func(c net.Conn) {
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		if tc.Handshake() == nil {
			_, _ = io.Copy(io.Discard, tc)
		}
	})
	alert := serveConns(t, func(c net.Conn) {
		tc := tls.Server(c, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return nil, fmt.Errorf("refused")
		}})
		_ = tc.Handshake()
	})
	closes := serveConns(t, func(net.Conn) {}) // the sidecar's refusal of other TCP
	banner := serveConns(t, func(c net.Conn) { fmt.Fprint(c, "SSH-2.0-fake\r\n"); _, _ = io.Copy(io.Discard, c) })
	web := serveConns(t, func(c net.Conn) {
		_, host, err := readRequest(bufio.NewReader(c))
		if err == nil {
			origin(c, host)
		}
	})
	refusing := serveConns(t, func(c net.Conn) {
		if _, _, err := readRequest(bufio.NewReader(c)); err == nil {
			fmt.Fprint(c, "HTTP/1.1 403 Forbidden\r\nX-Compass-Egress: denied; reason=not-allowlisted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		}
	})
	failing := serveConns(t, func(c net.Conn) {
		if _, _, err := readRequest(bufio.NewReader(c)); err == nil {
			fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\nX-Compass-Egress: error; reason=dial\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		}
	})
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	byName := func(addr string) string { return "ok.test:" + port(addr) }
	const short = 500

	tests := []struct {
		name               string
		check              Check
		reachable, refused bool
		detail             string
	}{
		{"tls handshake", Check{Kind: "tls", Target: tlsServer, Host: "ok.test"}, true, false, "TLS handshake done, server name ok.test"},
		{"tls by name through the resolver", Check{Kind: "tls", Target: byName(tlsServer), Resolver: resolver}, true, false, "server name ok.test"},
		{"tls alert", Check{Kind: "tls", Target: alert, Host: "no.test"}, false, false, "TLS handshake, server name no.test"},
		{"tls closed", Check{Kind: "tls", Target: closes, Host: "no.test"}, false, false, "TLS handshake"},
		{"tls name the resolver refuses", Check{Kind: "tls", Target: "no.test:443", Resolver: resolver}, false, false, "no address (REFUSED from the sidecar (compass-egress: not-allowlisted))"},
		{"http by Host", Check{Kind: "http", Target: web, Host: "ok.test"}, true, false, "direct GET: 200 OK"},
		{"http by name through the resolver", Check{Kind: "http", Target: byName(web), Resolver: resolver}, true, false, "direct GET: 200 OK"},
		{"http refused by the sidecar", Check{Kind: "http", Target: refusing, Host: "no.test"}, false, true, "from the sidecar (denied; reason=not-allowlisted)"},
		{"http sidecar error is not the destination", Check{Kind: "http", Target: failing}, false, false, "502 Bad Gateway from the sidecar (error; reason=dial)"},
		{"tcp banner", Check{Kind: "tcp", Target: banner, Expect: "SSH-"}, true, false, `the destination sent "SSH-2.0-fake\r\n"`},
		{"tcp banner by name through the resolver", Check{Kind: "tcp", Target: byName(banner), Resolver: resolver, Expect: "SSH-"}, true, false, "SSH-2.0-fake"},
		{"tcp wrong banner", Check{Kind: "tcp", Target: banner, Expect: "220 "}, false, false, `want a start of "220 "`},
		{"tcp closed without a byte", Check{Kind: "tcp", Target: closes, Expect: "SSH-"}, false, false, "nothing came back: EOF"},
		{"tcp silent", Check{Kind: "tcp", Target: silent(t), Expect: "SSH-", TimeoutMS: short}, false, false, "nothing came back"},
		{"tcp name the resolver refuses", Check{Kind: "tcp", Target: "no.test:22", Resolver: resolver, Expect: "SSH-"}, false, false, "resolve no.test through"},
		{"dns refused by the sidecar", Check{Kind: "dns", Server: resolver, QName: "no.test"}, true, true, "udp DNS: REFUSED from the sidecar (compass-egress: not-allowlisted)"},
		{"dns answer", Check{Kind: "dns", Server: resolver, QName: "ok.test"}, true, false, "udp DNS: NOERROR 127.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check.Name = tc.name
			r := runChecks([]Check{tc.check})[0]
			if r.Reachable != tc.reachable || r.Refused != tc.refused || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("got %+v\nwant reachable %v refused %v, detail containing %q", r, tc.reachable, tc.refused, tc.detail)
			}
		})
	}
}
