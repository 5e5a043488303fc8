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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/proxy/tlshello"
	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
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
