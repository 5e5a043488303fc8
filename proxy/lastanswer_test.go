package proxy

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"testing"
	"time"
)

// lastAnswerBounded runs answer, which writes a last answer to a client that reads
// nothing (a pipe nobody reads: every write blocks), and fails unless it returns: only
// the header timeout ends such a write, and the hang guard is far beyond it.
func lastAnswerBounded(t *testing.T, answer func(client net.Conn)) {
	t.Helper()
	client, peer := net.Pipe()
	defer peer.Close()
	defer client.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		answer(client)
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		client.Close()
		<-done
		t.Fatalf("a last answer to a client that reads nothing was still being written after %v", hangGuard)
	}
}

func connectRequest(target string) *http.Request {
	return &http.Request{Method: http.MethodConnect, URL: &url.URL{Host: target}, Host: target,
		Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, RemoteAddr: "127.0.0.1:1"}
}

// The answers that end a CONNECT unserved (a refusal, a failed dial, a swap between
// the decision and the dial, the drain) are written under the header timeout, as the
// front's other last answers are: a client that reads nothing cannot hold the goroutine
// and the connection slot.
func TestConnectLastAnswersAreBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = 200 * time.Millisecond })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)

	t.Run("refused", func(t *testing.T) {
		lastAnswerBounded(t, func(client net.Conn) {
			cc := &clientConn{c: client, br: bufio.NewReader(client)}
			if h.srv.front.connect(context.Background(), func() {}, cc, connectRequest("b.test:443")) {
				t.Error("a refused CONNECT was tunnelled")
			}
		})
	})

	t.Run("dial failed", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		v := Verdict{Allowed: true, Host: "a.test", Name: "a.test", Port: port, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}
		lastAnswerBounded(t, func(client net.Conn) {
			req := connectRequest(v.Host)
			if h.srv.openTunnel(req.Context(), func() {}, nil, req, client, nil, h.srv.current.Load(), v) {
				t.Error("a CONNECT whose dial failed was tunnelled")
			}
		})
	})

	t.Run("refused after a swap", func(t *testing.T) {
		old := h.srv.current.Load()
		h.apply(`"no-network"`)
		defer h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
		v := Verdict{Allowed: true, Host: "a.test", Name: "a.test", Port: h.a.echoPort, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}
		lastAnswerBounded(t, func(client net.Conn) {
			if h.srv.openTunnel(context.Background(), func() {}, nil, connectRequest(h.a.echoHostPort("a.test")), client, nil, old, v) {
				t.Error("a CONNECT refused by the policy in force was tunnelled")
			}
		})
	})
}
