package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/proxy/tlshello"
	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
)

// A record of another type before the ClientHello must not open the gate: Go's
// crypto/tls (conn.go: "first record does not look like a TLS handshake" lets an alert
// through, and a warning alert is dropped and the next record read) and BoringSSL
// (ssl_process_alert: warning alerts discarded, up to four, before a version is known)
// read the hello that follows, and route or pick a certificate by its name.
func TestTLSGateReviewRecordBeforeHello(t *testing.T) {
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
func TestTLSGateReviewAlertBeforeHelloGoServer(t *testing.T) {
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
func TestTLSGateReviewHeldHelloReadOnce(t *testing.T) {
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
