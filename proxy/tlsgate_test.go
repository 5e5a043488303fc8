package proxy

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/proxy/tlshello"
	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
)

// The server name of a tunnel's ClientHello, checked against the policy (helloGate):
// each case opens a tunnel to a.test's echo server, sends stream (in writes of the
// given sizes, or with the CONNECT when early), and either reads it echoed back or the
// unrecognized_name alert and the end of the tunnel.
func TestTunnelServerName(t *testing.T) {
	helloA, helloB, helloSvc := hellotest.ClientHello(t, "a.test"), hellotest.ClientHello(t, "b.test"), hellotest.ClientHello(t, "x.svc.test")
	host := hellotest.Host
	// Padded (extension 21) so that its one-byte records fill more than one read.
	bigHelloB := hellotest.With(append(hellotest.SNIExt(host, "b.test"), append([]byte{0, 21, 0x10, 0}, make([]byte, 0x1000)...)...))
	// In one-byte records, more bytes than a gate holds (tlshello.MaxStream, which one read
	// of the relay's buffer may overshoot) before the hello ends.
	hugeHelloA := hellotest.With(append(hellotest.SNIExt(host, "a.test"), append([]byte{0, 21, 0x38, 0}, make([]byte, 0x3800)...)...))
	// An encrypted_client_hello extension (its payload is opaque to the proxy).
	echHelloA := hellotest.With(append(hellotest.SNIExt(host, "a.test"), 0xfe, 0x0d, 0, 4, 1, 2, 3, 4))
	const allow = `{"network_mode":"allowlist","allowed_hosts":["a.test","*.svc.test"]}`
	for _, tc := range []struct {
		name    string
		policy  string
		target  string // "" for a.test's echo port by name
		stream  []byte
		writes  []int // sizes of the writes (the rest in one); nil: one write
		early   bool
		refused string // the reason of the tls decision; "" if the bytes pass
		line    bool   // a tls decision line is written
	}{
		{name: "the target's own name", policy: allow, stream: helloA},
		{name: "no server name", policy: allow, stream: hellotest.ClientHello(t, "")},
		{name: "not TLS", policy: allow, stream: []byte("SSH-2.0-x\r\n")},
		{name: "another allowed name", policy: allow, stream: helloSvc, line: true},
		{name: "a name the allowlist leaves out", policy: allow, stream: helloB, refused: "not-allowlisted", line: true},
		{name: "left out, in one-byte records", policy: allow, stream: hellotest.Refragment(helloB, 1), refused: "not-allowlisted", line: true},
		{name: "left out, in one-byte records past the relay's buffer", policy: allow, stream: hellotest.Refragment(bigHelloB, 1), refused: "not-allowlisted", line: true},
		{name: "records past the bound on held bytes", policy: allow, stream: hellotest.Refragment(hugeHelloA, 1), refused: "malformed-tls-hello", line: true},
		{name: "left out, in three writes", policy: allow, stream: helloB, writes: []int{1, 40}, refused: "not-allowlisted", line: true},
		{name: "allowed, in three writes", policy: allow, stream: helloSvc, writes: []int{3, 100}, line: true},
		{name: "left out, sent with the CONNECT", policy: allow, stream: helloB, early: true, refused: "not-allowlisted", line: true},
		{name: "allowed, sent with the CONNECT", policy: allow, stream: helloA, early: true},
		{name: "the name at the wrong port", policy: `{"network_mode":"allowlist","allowed_hosts":["a.test","b.test:1"]}`, stream: helloB, refused: "not-allowlisted", line: true},
		{name: "denylisted", policy: `{"network_mode":"denylist","denied_hosts":["b.test"]}`, stream: helloB, refused: "denylisted", line: true},
		{name: "not denylisted", policy: `{"network_mode":"denylist","denied_hosts":["b.test"]}`, stream: helloSvc, line: true},
		{name: "public", policy: `"public"`, stream: helloB, line: true},
		{name: "an address for a name", policy: allow, stream: hellotest.With(hellotest.SNIExt(host, "127.0.0.3")), refused: "invalid-host", line: true},
		{name: "unreadable hello", policy: allow, stream: hellotest.With(hellotest.SNIExt(host, "a.test", host, "b.test")), refused: "malformed-tls-hello", line: true},
		{name: "encrypted, the target's name outside", policy: allow, stream: echHelloA, refused: "encrypted-client-hello", line: true},
		{name: "encrypted, under public", policy: `"public"`, stream: echHelloA, line: true},
		{name: "an address target is not checked", policy: `{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/32"]}`, target: "127.0.0.2", stream: helloB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.apply(tc.policy)
			target := h.a.echoHostPort("a.test")
			if tc.target != "" {
				target = h.a.echoHostPort(tc.target)
			}
			early := ""
			if tc.early {
				early = string(tc.stream)
			}
			resp, c := h.connect(target, early)
			if c == nil {
				t.Fatalf("CONNECT %s: %s", target, resp.Status)
			}
			if !tc.early {
				rest := tc.stream
				for _, n := range tc.writes {
					if _, err := c.Write(rest[:n]); err != nil {
						t.Fatal(err)
					}
					rest = rest[n:]
					time.Sleep(20 * time.Millisecond) // separate reads for the relay
				}
				if _, err := c.Write(rest); err != nil {
					t.Fatal(err)
				}
			}
			if tc.refused == "" {
				got := make([]byte, len(tc.stream))
				if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, tc.stream) {
					t.Fatalf("echo: %v, %d bytes differ", err, len(got))
				}
			} else {
				// A reset, not a FIN, when the proxy closed with bytes of the client's unread.
				got, err := io.ReadAll(c)
				if (err != nil && !errors.Is(err, syscall.ECONNRESET)) || !bytes.Equal(got, tlshello.UnrecognizedNameAlert) {
					t.Fatalf("want the alert and the end of the tunnel, got %d bytes (%x…), %v", len(got), got[:min(len(got), 16)], err)
				}
			}
			lines := logLines(h.logs.String(), "decision")
			var tlsLines []map[string]any
			for _, l := range lines {
				if l["type"] == typeTLS {
					tlsLines = append(tlsLines, l)
				}
			}
			if !tc.line {
				if len(tlsLines) != 0 {
					t.Fatalf("unexpected tls decision: %v", tlsLines)
				}
				return
			}
			if len(tlsLines) != 1 {
				t.Fatalf("want one tls decision line, got %v", tlsLines)
			}
			l := tlsLines[0]
			wantDecision := "allowed"
			if tc.refused != "" {
				wantDecision = "denied"
				if l["reason"] != tc.refused {
					t.Fatalf("reason %v, want %s", l["reason"], tc.refused)
				}
				reqs := promtest.ToFloat64(h.srv.metrics.requests.WithLabelValues(typeTLS, "denied", tc.refused))
				if reqs != 1 {
					t.Fatalf("tls refusals counted: %v", reqs)
				}
				code, blocked := h.admin("GET", "/v1/blocked", "")
				if code != 200 || !strings.Contains(fmt.Sprint(blocked["top"]), "type:tls") {
					t.Fatalf("blocked: %d %v", code, blocked)
				}
			}
			if l["decision"] != wantDecision || l["addr"] != "127.0.0.2" {
				t.Fatalf("line %v", l)
			}
		})
	}
}

// A swap re-decides a tunnel's TLS server name as it does its target: tunnels opened
// under public for a.test with b.test's hello, or with an encrypted one, are cut when an
// allowlist of a.test comes into force; one with a.test's own hello is kept.
func TestSwapCutsTunnelByServerName(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	open := func(hello []byte) *tunnelConn {
		_, c := h.connect(h.a.echoHostPort("a.test"), "")
		if c == nil {
			t.Fatal("CONNECT refused")
		}
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, len(hello))); err != nil {
			t.Fatal(err)
		}
		return c
	}
	ech := hellotest.With(append(hellotest.SNIExt(hellotest.Host, "a.test"), 0xfe, 0x0d, 0, 1, 0))
	kept, cut, cutECH := open(hellotest.ClientHello(t, "a.test")), open(hellotest.ClientHello(t, "b.test")), open(ech)
	if res := h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`); res.ClosedConnections != 2 {
		t.Fatalf("swap closed %d connections, want 2", res.ClosedConnections)
	}
	for what, c := range map[string]*tunnelConn{"b.test's hello": cut, "an encrypted hello": cutECH} {
		_ = c.SetReadDeadline(time.Now().Add(hangGuard))
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("the tunnel with %s is still open (%d bytes)", what, n)
		}
	}
	if _, err := kept.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(kept, make([]byte, 1)); err != nil {
		t.Fatalf("the tunnel with a.test's hello was cut: %v", err)
	}
}

// A TLS client through the proxy: a handshake naming the tunnel's target completes, one
// naming a server the policy leaves out fails with the alert the client understands.
func TestTLSClientServerName(t *testing.T) {
	h := newHarness(t)
	cert := testutil.SelfSigned(t, "a.test")
	h.dns.set("tls.test", netip.MustParseAddr("127.0.0.25"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["tls.test"]}`)
	port := serveTCP(t, "127.0.0.25", func(c net.Conn, _ <-chan struct{}) {
		s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		_, _ = io.Copy(s, s)
	}).Port
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	for _, tc := range []struct {
		serverName string
		refused    bool
	}{
		{"tls.test", false},
		{"a.test", true},
	} {
		t.Run(tc.serverName, func(t *testing.T) {
			_, c := h.connect(fmt.Sprintf("tls.test:%d", port), "")
			if c == nil {
				t.Fatal("CONNECT refused")
			}
			tc2 := tls.Client(c, &tls.Config{ServerName: tc.serverName, InsecureSkipVerify: true})
			err := tc2.Handshake()
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
					t.Fatalf("handshake: %v, want the unrecognized_name alert", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(tc2, "ping"); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(tc2, make([]byte, 4)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// echKeys is an ECH key for a front end whose public name is publicName, and the
// ECHConfigList a client is given for it (draft-ietf-tls-esni §4: version 0xfe0d,
// DHKEM(X25519), HKDF-SHA256, AES-128-GCM).
func echKeys(t *testing.T, publicName string) (tls.EncryptedClientHelloKey, []byte) {
	t.Helper()
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub := priv.PublicKey().Bytes()
	var c []byte
	c = append(c, 7, 0x00, 0x20)                     // config_id, kem_id
	c = append(c, byte(len(pub)>>8), byte(len(pub))) // public_key
	c = append(c, pub...)
	c = append(c, 0, 4, 0, 1, 0, 1) // cipher_suites: HKDF-SHA256, AES-128-GCM
	c = append(c, 0, byte(len(publicName)))
	c = append(c, publicName...)
	c = append(c, 0, 0) // no extensions
	config := append([]byte{0xfe, 0x0d, byte(len(c) >> 8), byte(len(c))}, c...)
	list := append([]byte{byte(len(config) >> 8), byte(len(config))}, config...)
	return tls.EncryptedClientHelloKey{Config: config, PrivateKey: priv.Bytes()}, list
}

// Real ECH, as a client that wants b.test sends it behind a front end that serves it:
// the target's own name outside, b.test inside. Under an allowlist of the target the
// tunnel is refused before the front end sees the hello; under public the same
// handshake completes with ECH accepted, which shows the hello is the real thing.
func TestEncryptedClientHelloThroughTunnel(t *testing.T) {
	cert := testutil.SelfSigned(t, "tls.test")
	key, list := echKeys(t, "tls.test")
	for _, tc := range []struct {
		policy  string
		refused bool
	}{
		{`{"network_mode":"allowlist","allowed_hosts":["tls.test"]}`, true},
		{`"public"`, false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			h := newHarness(t)
			h.dns.set("tls.test", netip.MustParseAddr("127.0.0.26"))
			h.apply(tc.policy)
			seen := make(chan string, 1)
			port := serveTCP(t, "127.0.0.26", func(c net.Conn, _ <-chan struct{}) {
				s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
					EncryptedClientHelloKeys: []tls.EncryptedClientHelloKey{key},
					GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
						seen <- hi.ServerName
						return nil, nil
					}})
				_ = s.Handshake()
			}).Port
			_, c := h.connect(fmt.Sprintf("tls.test:%d", port), "")
			if c == nil {
				t.Fatal("CONNECT refused")
			}
			tc2 := tls.Client(c, &tls.Config{ServerName: "b.test", InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
				EncryptedClientHelloConfigList: list})
			err := tc2.Handshake()
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
					t.Fatalf("handshake: %v, want the unrecognized_name alert", err)
				}
				select {
				case name := <-seen:
					t.Fatalf("the front end read a hello for %q", name)
				default:
				}
				return
			}
			if err != nil || !tc2.ConnectionState().ECHAccepted {
				t.Fatalf("handshake: %v, ECH accepted: %v", err, tc2.ConnectionState().ECHAccepted)
			}
			if name := <-seen; name != "b.test" {
				t.Fatalf("the front end served %q, want the inner b.test", name)
			}
		})
	}
}

// A record of another type before the ClientHello must not open the gate: Go's
// crypto/tls (conn.go: "first record does not look like a TLS handshake" lets an alert
// through, and a warning alert is dropped and the next record read) and BoringSSL
// (ssl_process_alert: warning alerts discarded, up to four, before a version is known)
// read the hello that follows, and route or pick a certificate by its name.
func TestTLSGateRecordBeforeHello(t *testing.T) {
	helloB := hellotest.ClientHello(t, "b.test")
	const allow = `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`
	for _, tc := range []struct {
		name   string
		prefix []byte
	}{
		{"warning alert", []byte{21, 3, 1, 0, 2, 1, 112}},
		{"warning alert, record version 0.0", []byte{21, 0, 0, 0, 2, 1, 90}},
		{"change_cipher_spec", []byte{20, 3, 3, 0, 1, 1}},
		{"application data", []byte{23, 3, 3, 0, 1, 0}},
		{"heartbeat", []byte{24, 3, 3, 0, 3, 1, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.apply(allow)
			resp, c := h.connect(h.a.echoHostPort("a.test"), "")
			if c == nil {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			if _, err := c.Write(append(append([]byte{}, tc.prefix...), helloB...)); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if (err != nil && !errors.Is(err, syscall.ECONNRESET)) || !bytes.Equal(got, tlshello.UnrecognizedNameAlert) {
				t.Fatalf("want the alert and the end of the tunnel, got %d bytes (%x…), %v", len(got), got[:min(len(got), 16)], err)
			}
			var reasons []any
			for _, l := range logLines(h.logs.String(), "decision") {
				if l["type"] == typeTLS {
					reasons = append(reasons, l["reason"])
				}
			}
			if len(reasons) != 1 || reasons[0] != ReasonMalformedHello {
				t.Fatalf("tls decisions: %v, want one %s", reasons, ReasonMalformedHello)
			}
		})
	}
}

// alertFirstConn sends a warning alert record in front of the first bytes written (a
// client's ClientHello).
type alertFirstConn struct {
	net.Conn
	sent bool
}

func (c *alertFirstConn) Write(p []byte) (int, error) {
	if c.sent {
		return c.Conn.Write(p)
	}
	c.sent = true
	if _, err := c.Conn.Write(append([]byte{21, 3, 1, 0, 2, 1, 112}, p...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// End to end with Go's own TLS server behind the tunnel: a warning alert in front of a
// ClientHello for a name the policy leaves out must not let that handshake through.
func TestTLSGateAlertBeforeHelloGoServer(t *testing.T) {
	h := newHarness(t)
	cert := testutil.SelfSigned(t, "tls.test")
	h.dns.set("tls.test", netip.MustParseAddr("127.0.0.26"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["tls.test"]}`)
	seen := make(chan string, 1)
	port := serveTCP(t, "127.0.0.26", func(c net.Conn, _ <-chan struct{}) {
		s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert},
			GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
				seen <- chi.ServerName
				return nil, nil
			}})
		_, _ = io.Copy(s, s)
	}).Port
	_, c := h.connect(fmt.Sprintf("tls.test:%d", port), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	tc := tls.Client(&alertFirstConn{Conn: c}, &tls.Config{ServerName: "b.test", InsecureSkipVerify: true})
	err := tc.Handshake()
	select {
	case name := <-seen:
		t.Fatalf("the server read a ClientHello for %q (handshake: %v)", name, err)
	default:
	}
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("handshake: %v, want the unrecognized_name alert", err)
	}
}

// A gate re-reads none of what it has read: a hello of one-byte records (the most
// records a bound on held bytes lets through) fed a few bytes at a time costs memory in
// proportion to its length, not to its length times the number of reads.
func TestTLSGateHeldHelloReadOnce(t *testing.T) {
	host := hellotest.Host
	// 9 KiB of padding: about 57 KiB of one-byte records, under tlshello.MaxStream.
	stream := hellotest.Refragment(hellotest.With(append(hellotest.SNIExt(host, "a.test"), append([]byte{0, 21, 0x24, 0}, make([]byte, 0x2400)...)...)), 1)
	if len(stream) > tlshello.MaxStream {
		t.Fatalf("stream of %d bytes is over the bound", len(stream))
	}
	g := &helloGate{} // never decides below: the last byte is not fed
	var before, after runtimeAlloc
	before.read()
	for off := 0; off < len(stream)-1; off += 16 {
		out, done, err := g.Feed(stream[off:min(off+16, len(stream)-1)])
		if out != nil || done || err != nil {
			t.Fatalf("at %d: %d bytes out, done=%v, %v", off, len(out), done, err)
		}
	}
	after.read()
	// The held bytes and one reassembled message, each grown by doubling, are well
	// under 1 MiB; re-reading every record at each of the 3 600 reads was about 70 MiB.
	if grew := after.bytes - before.bytes; grew > 1<<20 {
		t.Fatalf("feeding a %d-byte hello allocated %d bytes", len(stream), grew)
	}
}

// runtimeAlloc is the process's count of bytes allocated so far.
type runtimeAlloc struct{ bytes uint64 }

func (a *runtimeAlloc) read() {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	a.bytes = m.TotalAlloc
}

// The gate must not grow the relay's goroutine stacks, which stay at Go's 2 KiB start
// for a tunnel's life (see direction) and which only a collection would shrink: the
// goroutines' stack memory after a tunnel's first bytes went both ways is the same
// whether they were a ClientHello (read and decided by the gate, a decision line
// written for another name) or not.
func TestTLSGateRelayStackStaysSmall(t *testing.T) {
	const tunnels = 100
	plain := make([]byte, 512)
	for i := range plain {
		plain[i] = 'x'
	}
	for _, tc := range []struct {
		name  string
		first []byte
	}{
		{"not TLS", plain},
		{"the target's own name", hellotest.ClientHello(t, "a.test")},
		{"another allowed name", hellotest.ClientHello(t, "x.svc.test")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","*.svc.test"]}`)
			conns := make([]*tunnelConn, tunnels)
			for i := range conns {
				resp, c := h.connect(h.a.echoHostPort("a.test"), "")
				if c == nil {
					t.Fatalf("CONNECT: %s", resp.Status)
				}
				defer c.Close()
				conns[i] = c
			}
			runtime.GC()
			defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection shrinks stacks meanwhile
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for _, c := range conns {
				if _, err := c.Write(tc.first); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, make([]byte, len(tc.first))); err != nil {
					t.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			// A goroutine that outgrows 2 KiB takes 4 KiB or more: 2 KiB more per tunnel.
			if grew := int64(after.StackInuse) - int64(before.StackInuse); grew > tunnels*1024 {
				t.Fatalf("stacks grew by %d bytes over %d tunnels", grew, tunnels)
			}
		})
	}
}
