package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/internal/testutil"
)

// The fakes below listen on 127.0.0.1 only: the probe's checks are pointed at them,
// and at ports where nothing listens, never at a real address.

// serveConns accepts loopback connections and hands each to handle in its own
// goroutine; the test's cleanup closes the listener and every connection, and waits.
func serveConns(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// closedTCP is a loopback address where nothing listens (a closed listener's).
func closedTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// closedUDP is a loopback UDP address where nothing listens.
func closedUDP(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	return addr
}

// silentUDP is a loopback UDP socket that never answers: a dropped query.
func silentUDP(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String()
}

// silent accepts connections and never answers: a proxy or host that drops traffic.
func silent(t *testing.T) string {
	return serveConns(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
}

// silentCounting is silent, and reports the most connections it held open at once.
func silentCounting(t *testing.T) (addr string, most func() int) {
	var mu sync.Mutex
	open, peak := 0, 0
	addr = serveConns(t, func(c net.Conn) {
		mu.Lock()
		open++
		peak = max(peak, open)
		mu.Unlock()
		_, _ = io.Copy(io.Discard, c)
		mu.Lock()
		open--
		mu.Unlock()
	})
	return addr, func() int {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// hangGuard bounds a test's wait for something that must end: far above any time a
// slow or loaded machine plausibly takes, so that reaching it means it never ended.
const hangGuard = time.Minute

// fakeProxy answers like compass-proxy: with status, or when it is 200, by serving the
// origin itself ("fakenet HOST"), in plain HTTP for a GET and in TLS inside a CONNECT.
// It records each request as "METHOD URI Host=HOST", the tunnelled one after " | ".
type fakeProxy struct {
	Addr string
	mu   sync.Mutex
	seen []string
}

func startProxy(t *testing.T, status int) *fakeProxy {
	t.Helper()
	p := &fakeProxy{}
	cfg := &tls.Config{Certificates: []tls.Certificate{testutil.SelfSigned(t, "a.test")}}
	p.Addr = serveConns(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(hangGuard))
		line, host, err := readRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		if status != http.StatusOK {
			p.record(line)
			fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\n\r\n", status, http.StatusText(status))
			return
		}
		if !strings.HasPrefix(line, http.MethodConnect+" ") {
			p.record(line)
			origin(c, host)
			return
		}
		fmt.Fprint(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		tc := tls.Server(c, cfg)
		inner, host, err := readRequest(bufio.NewReader(tc))
		if err != nil {
			p.record(line + " | " + err.Error())
			return
		}
		p.record(line + " | " + inner)
		origin(tc, host)
	})
	return p
}

func (p *fakeProxy) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, s)
}

func (p *fakeProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// readRequest reads a request's head as sent: "METHOD URI Host=HOST" (the Host header,
// which http.ReadRequest would replace with an absolute URI's host) and the host.
func readRequest(br *bufio.Reader) (line, host string, err error) {
	tp := textproto.NewReader(br)
	first, err := tp.ReadLine()
	if err != nil {
		return "", "", err
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return "", "", err
	}
	host = hdr.Get("Host")
	return strings.TrimSuffix(first, " HTTP/1.1") + " Host=" + host, host, nil
}

func origin(w io.Writer, host string) {
	body := "fakenet " + host + "\n"
	fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// startDNS serves a.test. (A 192.0.2.1) on loopback UDP and TCP; other names are
// NXDOMAIN. It returns the UDP and TCP addresses.
func startDNS(t *testing.T) (udp, tcp string) {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Name == "a.test." {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: "a.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
				A:   net.IPv4(192, 0, 2, 1),
			})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	return testutil.ServeDNS(t, h)
}
