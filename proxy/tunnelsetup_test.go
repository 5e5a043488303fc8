package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// A client that reads nothing (its socket buffers full: it pipelined a request with a
// large answer before the CONNECT) blocks the write of its 200. A swap must still cut
// every tunnel the new policy refuses and return, and new connections must go on.
func TestSwapIsNotHeldByAStuckEstablishedWrite(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test"]}`)
	var others []*tunnelConn
	for range 8 {
		_, other := h.connect(h.b.echoHostPort("b.test"), "")
		if other == nil {
			t.Fatal("b.test tunnel refused")
		}
		others = append(others, other)
	}
	opened, peer, _ := openToStuckClient(t, h, h.a.echoHostPort("a.test"))
	waitFor(t, func() bool { return h.srv.tracker.len() == 9 })

	applied := make(chan adminapi.ApplyResult, 1)
	go func() { applied <- h.apply(`{"network_mode":"allowlist","allowed_hosts":["x.svc.test"]}`) }()
	select {
	case r := <-applied:
		if r.ClosedConnections != 9 {
			t.Errorf("the swap closed %d connections, want 9", r.ClosedConnections)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the swap has not returned after 10 s: it waits for a client's write")
	}
	// If the swap came before the tunnel was established, openTunnel now writes a 403.
	go func() { _, _ = io.Copy(io.Discard, peer) }()
	for i, other := range others {
		_ = other.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(other, "ping")
		if _, err := io.ReadFull(other, make([]byte, 4)); err == nil {
			t.Errorf("b.test tunnel %d still relays after the swap to a policy that refuses it", i)
		}
	}
	if code, _ := h.connectStatus(h.c.echoHostPort("x.svc.test")); code != http.StatusOK {
		t.Errorf("a CONNECT the new policy allows: %d", code)
	}
	if <-opened {
		t.Error("the cut tunnel reported established")
	}
}

// The drain's deadline cuts a CONNECT whose name is still being resolved. The lookup's
// own budget (twice a DNS timeout of ten minutes) is far beyond the test's hang guard:
// Shutdown returns before the guard only if the drain's deadline cut the lookup.
func TestDrainDeadlineCutsConnectLookup(t *testing.T) {
	silent, err := net.ListenPacket("udp", "127.0.0.1:0") // a resolver that never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	const dnsTimeout = 10 * time.Minute
	h := newHarness(t, func(c *Config) {
		c.DNSUpstreams = []string{silent.LocalAddr().String()}
		c.DNSTimeout = dnsTimeout
	})
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT slow.test:443 HTTP/1.1\r\nHost: slow.test:443\r\n\r\n")
	_ = silent.SetReadDeadline(time.Now().Add(hangGuard))
	if _, _, err := silent.ReadFrom(make([]byte, 512)); err != nil {
		t.Fatalf("the lookup never reached the resolver: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = h.srv.Shutdown(ctx) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		h.srv.ownResolver.Close() // ends the lookup, so that Shutdown and the test end
		<-done
		t.Fatalf("Shutdown with a 100 ms drain deadline still waited %v later: it waits for the lookup (budget %v)",
			hangGuard, dnsupstream.LookupBudget(dnsTimeout, 1))
	}
}

// The drain's deadline cuts a CONNECT whose dial is still waiting: the dial ends there
// (the drain then returns, not when the dial would have timed out), no Warn line blames
// the upstream, and the client, if its connection is not closed first, hears that the
// proxy is draining (it was a 502 dial-failed).
func TestDrainDeadlineCutsConnectDial(t *testing.T) {
	h, port, _, _ := slowDestination(t, time.Hour)
	c := h.dialProxy(t)
	fmt.Fprintf(c, "CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port)
	// Decided before the dial, which then waits.
	h.waitLive(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	shut := make(chan struct{})
	go func() { _ = h.srv.Shutdown(ctx); close(shut) }()
	select {
	case <-shut:
	case <-time.After(hangGuard):
		t.Fatalf("the drain still waits %v after its deadline: the dial it cut goes on", hangGuard)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	if got := string(buf[:n]); got != "" && !strings.Contains(got, "reason=draining") {
		t.Errorf("the client got %q, want a 503 draining or the close", firstLine(got))
	}
	if strings.Contains(h.logs.String(), `"msg":"dial failed"`) {
		t.Errorf("a Warn line blames the upstream: %s", h.logs.String())
	}
}

// A CONNECT whose request the drain ended before the tunnel's dial began (the moment
// before the tunnel's dial takes over the request's end) dials nothing: it returns at
// once rather than when the dial would have timed out.
func TestEndedRequestDialsNoTunnel(t *testing.T) {
	h, port, _, _ := slowDestination(t, time.Hour)
	req, rs, v := decidedConnect(t, h, fmt.Sprintf("slow.test:%d", port))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	client, peer := net.Pipe()
	defer peer.Close()
	go func() { _, _ = io.Copy(io.Discard, peer) }()
	result := make(chan bool, 1)
	go func() { result <- h.srv.openTunnel(ctx, cancel, nil, req, client, nil, rs, v) }()
	select {
	case ok := <-result:
		if ok {
			t.Error("a tunnel opened for a request already ended")
		}
	case <-time.After(hangGuard):
		t.Fatalf("the dial of a request already ended still waits after %v", hangGuard)
	}
}

// A client that reads nothing blocks the write of its 200; --header-timeout ends that
// write as it ends the front's other last answers, and the tunnel gives back its
// connection, its slot in the drain's count and its place in the tracker.
func TestTunnelConfirmationWriteIsBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = 200 * time.Millisecond })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	opened, _, _ := openToStuckClient(t, h, h.a.echoHostPort("a.test"))
	select {
	case ok := <-opened:
		if ok {
			t.Error("a tunnel whose 200 was never written reported established")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write of the 200 to a client that reads nothing still blocks after 10 s")
	}
	waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
}

// openToStuckClient decides a CONNECT to target (which must be allowed) and opens the
// tunnel for a client that reads nothing, so that the write of its 200 blocks. opened
// reports what openTunnel returned; peer is the client's end, which nothing reads
// until the test does; writing is closed when the first write to the client starts.
func openToStuckClient(t *testing.T, h *harness, target string) (opened <-chan bool, peer net.Conn, writing <-chan struct{}) {
	t.Helper()
	pipe, peer := net.Pipe()
	t.Cleanup(func() { peer.Close() })
	client := &writeSignal{Conn: pipe, started: make(chan struct{})}
	req, rs, v := decidedConnect(t, h, target)
	result := make(chan bool, 1)
	go func() { result <- h.srv.openTunnel(req.Context(), func() {}, nil, req, client, nil, rs, v) }()
	return result, peer, client.started
}

// decidedConnect is a CONNECT to target as the front hands it to openTunnel: its
// request, the rule set in force and its verdict, which must allow it.
func decidedConnect(t *testing.T, h *harness, target string) (*http.Request, *RuleSet, Verdict) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodConnect, "http://"+target, nil)
	req.URL.Host, req.RemoteAddr = target, "127.0.0.1:1"
	rs := h.srv.current.Load()
	v := h.srv.decideTunnel(context.Background(), rs, target, req.RemoteAddr)
	if !v.Allowed {
		t.Fatalf("%s refused", target)
	}
	return req, rs, v
}

// writeSignal is a connection that closes started when its first write begins.
type writeSignal struct {
	net.Conn
	once    sync.Once
	started chan struct{}
}

func (w *writeSignal) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.started) })
	return w.Conn.Write(p)
}

// A swap that cuts a tunnel while its 200 is on its way lets the 200 out, bounded by
// lingerTime, and has closed the client's side by the time it returns: a connection
// opened under public must not outlive the switch to no-network on either side.
func TestSwapClosesTheClientOfATunnelBeingConfirmed(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	opened, peer, writing := openToStuckClient(t, h, h.a.echoHostPort("a.test"))
	<-writing
	if r := h.apply(`"no-network"`); r.ClosedConnections != 1 {
		t.Fatalf("the swap closed %d connections, want 1", r.ClosedConnections)
	}
	_ = peer.SetReadDeadline(time.Now().Add(hangGuard))
	if n, err := peer.Read(make([]byte, 64)); err != io.EOF {
		t.Errorf("the client's side after the swap returned: read %d bytes, %v; want it closed (EOF)", n, err)
	}
	if <-opened {
		t.Error("the cut tunnel reported established")
	}
}

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
			r := &httpfront.Request{Ctx: context.Background(), Cancel: func() {}, Conn: client}
			if h.srv.serveConnect(r, connectRequest("b.test:443")) {
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
