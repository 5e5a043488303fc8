// Command fakenet is the e2e tests' fake internet: one container on the egress network
// that answers every *.test name with its own address (DNS on :53, UDP and TCP) and
// serves HTTP on :80 and HTTPS on :443 (a self-signed certificate made at start) for
// any of those names. /stream sends a line every 100 ms, stamped with its send time, until
// the client goes away. Port 22 speaks first, as SSH does: a banner line, then it echoes
// every line back, for the transparent path's tests of protocols that name no host. UDP
// port 7 echoes each datagram (RFC 862), so a test can tell a datagram that arrived from
// one that was dropped on the way.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ip, err := ownAddress()
	if err != nil {
		log.Error("fakenet: own address", "err", err)
		os.Exit(1)
	}
	cert, err := selfSigned()
	if err != nil {
		log.Error("fakenet: certificate", "err", err)
		os.Exit(1)
	}
	dnsHandler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { answer(w, q, ip) })
	errs := make(chan error, 6)
	for _, n := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: ":53", Net: n, Handler: dnsHandler}
		go func() { errs <- srv.ListenAndServe() }()
	}
	mux := newMux()
	plain := &http.Server{Addr: ":80", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	secure := &http.Server{Addr: ":443", Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go func() { errs <- plain.ListenAndServe() }()
	go func() { errs <- secure.ListenAndServeTLS("", "") }()
	go func() {
		ln, err := net.Listen("tcp", ":22")
		if err == nil {
			err = serveBanner(ln)
		}
		errs <- err
	}()
	go func() {
		pc, err := net.ListenPacket("udp", ":7")
		if err == nil {
			err = serveUDPEcho(pc)
		}
		errs <- err
	}()
	log.Info("fakenet: serving", "addr", ip.String())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errs:
		log.Error("fakenet: server", "err", err)
		os.Exit(1)
	case <-sig:
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = plain.Shutdown(ctx)
		_ = secure.Shutdown(ctx)
	}
}

// newMux serves /stream, and "fakenet HOST" on every other path.
func newMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", streamLines)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "fakenet %s\n", r.Host)
	})
	return mux
}

// answer gives every *.test name this container's address, and every other name NXDOMAIN.
func answer(w dns.ResponseWriter, q *dns.Msg, ip net.IP) {
	m := new(dns.Msg)
	m.SetReply(q)
	for _, question := range q.Question {
		if !strings.HasSuffix(strings.ToLower(question.Name), ".test.") {
			m.Rcode = dns.RcodeNameError
			continue
		}
		if question.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
				A:   ip,
			})
		}
	}
	_ = w.WriteMsg(m)
}

func streamLines(w http.ResponseWriter, r *http.Request) {
	fl, _ := w.(http.Flusher)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		// The send time lets a test tell a line sent after a moment from one merely read
		// after it (the probe's stream reports both).
		if _, err := fmt.Fprintf(w, "line %d sent_ms=%d\n", i, time.Now().UnixMilli()); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

func ownAddress() (net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.To4(), nil
		}
	}
	return nil, fmt.Errorf("no IPv4 address")
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fakenet.test"},
		DNSNames:     []string{"*.test", "fakenet.test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// sshBanner is what port 22 sends first, before the client says anything.
const sshBanner = "SSH-2.0-fakenet\r\n"

// serveBanner greets each connection ln accepts with sshBanner and echoes what it is
// sent, until ln closes.
func serveBanner(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := io.WriteString(c, sshBanner); err == nil {
				_, _ = io.Copy(c, c)
			}
		}()
	}
}

// serveUDPEcho sends every datagram pc receives back to its sender, until pc closes.
func serveUDPEcho(pc net.PacketConn) error {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}
