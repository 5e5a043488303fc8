package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/internal/testutil"
)

// The DNS and HTTP servers of the tests serve in goroutines; /stream must end with its client.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// own stands for the container's address: it is only ever put in answers, never dialled.
var own = net.IPv4(192, 0, 2, 80).To4()

// startDNS serves answer on loopback UDP and TCP, as main does on :53.
func startDNS(t *testing.T) (udp, tcp string) {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { answer(w, q, own) })
	return testutil.ServeDNS(t, h)
}

// TestAnswer: every name under .test, in any case, has the container's address; other
// names do not exist; other types of .test names exist with no records.
func TestAnswer(t *testing.T) {
	udp, tcp := startDNS(t)
	tests := []struct {
		name  string
		qname string
		qtype uint16
		rcode int
		addrs []string
	}{
		{"name under .test", "stream.test.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.80"}},
		{"deeper name under .test", "a.b.example.test.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.80"}},
		{"upper case", "API.Example.TEST.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.80"}},
		{"AAAA: no records", "stream.test.", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"outside .test", "example.com.", dns.TypeA, dns.RcodeNameError, nil},
		{"test as a label", "test.example.", dns.TypeA, dns.RcodeNameError, nil},
		{"ends in test, not .test", "latest.", dns.TypeA, dns.RcodeNameError, nil},
		{"the TLD itself", "test.", dns.TypeA, dns.RcodeNameError, nil},
	}
	for _, network := range []string{"udp", "tcp"} {
		server := map[string]string{"udp": udp, "tcp": tcp}[network]
		for _, tc := range tests {
			t.Run(network+"/"+tc.name, func(t *testing.T) {
				q := new(dns.Msg)
				q.SetQuestion(tc.qname, tc.qtype)
				cl := &dns.Client{Net: network, Timeout: hangGuard}
				resp, _, err := cl.Exchange(q, server)
				if err != nil {
					t.Fatal(err)
				}
				var addrs []string
				for _, rr := range resp.Answer {
					a, ok := rr.(*dns.A)
					if !ok || a.Hdr.Name != tc.qname || a.Hdr.Ttl != 5 {
						t.Errorf("answer record %v: want an A record for %s, TTL 5", rr, tc.qname)
						continue
					}
					addrs = append(addrs, a.A.String())
				}
				if resp.Rcode != tc.rcode || strings.Join(addrs, ",") != strings.Join(tc.addrs, ",") || resp.Id != q.Id || !resp.Response {
					t.Errorf("got %s %v (id %d, response %v), want %s %v", dns.RcodeToString[resp.Rcode], addrs, resp.Id, resp.Response, dns.RcodeToString[tc.rcode], tc.addrs)
				}
			})
		}
	}
}

// TestHTTP: every name is served, over HTTP and over HTTPS with a certificate for *.test.
func TestHTTP(t *testing.T) {
	plain := httptest.NewServer(newMux())
	t.Cleanup(plain.Close)
	cert, err := selfSigned()
	if err != nil {
		t.Fatal(err)
	}
	secure := httptest.NewUnstartedServer(newMux())
	secure.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	secure.StartTLS()
	t.Cleanup(secure.Close)
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)

	tests := []struct {
		name, host, path string
		tls              bool
		body, err        string
	}{
		{"plain", "api.test", "/", false, "fakenet api.test\n", ""},
		{"plain, any path and port", "api.test:8080", "/v1/x?y=z", false, "fakenet api.test:8080\n", ""},
		{"TLS for a name under .test", "api.test", "/", true, "fakenet api.test\n", ""},
		{"TLS for fakenet.test", "fakenet.test", "/", true, "fakenet fakenet.test\n", ""},
		{"TLS, a name outside .test", "example.com", "/", true, "", "certificate is valid for *.test, fakenet.test, not example.com"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, tr := plain, &http.Transport{}
			if tc.tls {
				// Dial the loopback server, verify the certificate as tc.host's.
				srv, tr = secure, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: tc.host}}
			}
			defer tr.CloseIdleConnections()
			req, err := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = tc.host
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != tc.body {
				t.Errorf("got %s %q, want 200 %q", resp.Status, body, tc.body)
			}
		})
	}
}

// hangGuard bounds a test's wait for something fakenet must do (answer, send a line,
// stop): far above any time a slow or loaded machine plausibly takes, so that reaching
// it means it never happened, not that it happened late.
const hangGuard = 30 * time.Second

// TestStreamLines: /stream sends numbered lines no faster than every 100 ms, each as it
// is written, and stops when the client goes away. How much slower a loaded machine
// sends them is not asserted.
func TestStreamLines(t *testing.T) {
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(ended)
		newMux().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Unflushed lines (and headers) would sit in the server's buffer (4 KiB: most of a
	// minute of lines, past the hang guard) and then come all at once.
	watchdog := time.AfterFunc(hangGuard, cancel)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("%v (nothing within %v)", err, hangGuard)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var at []time.Time
	for i := range 4 {
		got, err := br.ReadString('\n')
		want := fmt.Sprintf("line %d sent_ms=", i)
		stamp, serr := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(got, want), "\n"), 10, 64)
		if err != nil || !strings.HasPrefix(got, want) || serr != nil || stamp > time.Now().UnixMilli() {
			t.Fatalf("line %d: %q, %v; want %q and its send time, within %v", i, got, err, want, hangGuard)
		}
		at = append(at, time.Now())
	}
	watchdog.Stop()
	if gap := at[3].Sub(at[0]); gap < 250*time.Millisecond {
		t.Errorf("lines 0 to 3 came over %v, want at least 250 ms (a line every 100 ms, each flushed)", gap)
	}
	cancel()
	select {
	case <-ended:
	case <-time.After(hangGuard):
		t.Fatalf("/stream still running %v after its client went away", hangGuard)
	}
}

// TestOwnAddress: the address fakenet gives every name is an IPv4 one other hosts can reach.
func TestOwnAddress(t *testing.T) {
	ip, err := ownAddress()
	if err != nil {
		if err.Error() != "no IPv4 address" {
			t.Fatal(err)
		}
		t.Skip("this host has no non-loopback IPv4 address")
	}
	if len(ip) != net.IPv4len || ip.IsLoopback() {
		t.Errorf("own address %v (%d bytes): want a 4-byte, non-loopback IPv4 address", ip, len(ip))
	}
}

func TestBannerSpeaksFirstThenEchoes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serveBanner(ln) }()
	defer func() { ln.Close(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != sshBanner {
		t.Fatalf("first line %q, %v; want the banner before the client says anything", line, err)
	}
	if _, err := io.WriteString(c, "SSH-2.0-agent\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "SSH-2.0-agent\r\n" {
		t.Fatalf("echo %q, %v", line, err)
	}
}

func TestUDPEchoSendsEachDatagramBack(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serveUDPEcho(pc) }()
	defer func() { pc.Close(); <-done }()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	for _, msg := range []string{"answer=42", "second datagram"} {
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Fatalf("echo %q, %v; want %q", buf[:n], err, msg)
		}
	}
}
