package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// panicConn is a client connection whose Read panics once a read returns onRead, and
// whose Write panics on a write that carries onWrite: the stand-in for a bug one client
// can reach.
type panicConn struct {
	net.Conn
	onRead, onWrite string
	beforePanic     func() // if set, runs first
}

func (c *panicConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.onRead != "" && bytes.Contains(p[:n], []byte(c.onRead)) {
		panic("test: read panics")
	}
	return n, err
}

func (c *panicConn) Write(p []byte) (int, error) {
	if c.onWrite != "" && bytes.Contains(p, []byte(c.onWrite)) {
		if c.beforePanic != nil {
			c.beforePanic()
		}
		panic("test: write panics")
	}
	return c.Conn.Write(p)
}

// servePanicking hands the proxy's front a client connection wrapped in a panicConn,
// the way its accept loop hands one over (a slot, tracked, to a worker), and returns
// the client's end.
func (h *harness) servePanicking(t *testing.T, onRead, onWrite string, beforePanic func()) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	_ = client.SetDeadline(time.Now().Add(hangGuard))
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := &panicConn{Conn: server, onRead: onRead, onWrite: onWrite, beforePanic: beforePanic}
	h.srv.proxyLn.Hold()
	if !h.srv.front.Handle(c) {
		t.Fatal("the front is draining")
	}
	return client
}

// echoOnce listens on ip for one connection, which it echoes; the channel closes once
// the other end has closed it (or half-closed it). The tunnel's upstream side is the
// proxy's own socket, which no other check of the panic's releases would see left open.
func echoOnce(t *testing.T, ip netip.Addr) (uint16, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	accepted := make(chan net.Conn, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		accepted <- c
		_, _ = io.Copy(c, c)
		close(closed)
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case c := <-accepted:
			c.Close()
		case <-done:
		}
		<-done
	})
	return uint16(ln.Addr().(*net.TCPAddr).Port), closed
}

// checkRecovered checks that one panic of component was counted and logged with its
// value and stack, and that nothing the connection held is still held: no tracked
// entry, no connection of the front's, no slot, no tunnel the drain would wait for,
// no active connection in the gauges.
func (h *harness) checkRecovered(t *testing.T, component, value string) {
	t.Helper()
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), value) })
	var line string
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, `"msg":"panic recovered"`) && strings.Contains(l, value) {
			line = l
		}
	}
	for _, want := range []string{`"level":"ERROR"`, `"component":"` + component + `"`, `"client":"127.0.0.1:`, `"stack":"goroutine `} {
		if !strings.Contains(line, want) {
			t.Errorf("no %s in the panic's log line: %s", want, line)
		}
	}
	waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
	waitFor(t, func() bool {
		return h.srv.front.Conns() == 0
	})
	// The accept loop holds a slot while it waits for the next connection.
	waitFor(t, func() bool { return h.srv.proxyLn.Held() <= 1 })
	tunnels := make(chan struct{})
	go func() { h.srv.tunnels.Wait(); close(tunnels) }()
	select {
	case <-tunnels:
	case <-time.After(hangGuard):
		t.Fatal("the drain would wait for a tunnel the panic ended")
	}
	m := h.metricsText()
	for _, want := range []string{
		`compass_proxy_panics_total{component="` + component + `"} 1`,
		`compass_proxy_active_connections{type="connect"} 0`,
		`compass_proxy_active_connections{type="http"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("no %s in:\n%s", want, grepLines(m, "compass_proxy_"))
		}
	}
}

// TestFrontRecoversPanic: a panic while serving one client connection (reading its
// head, writing a CONNECT's 200, in the tunnel's relay either way, in the forward
// path) ends that connection alone. It is closed, with nothing written after the
// panic but a 500 when nothing of the answer had gone out; what it held is given back;
// the proxy goes on serving the next connection.
func TestFrontRecoversPanic(t *testing.T) {
	for _, tc := range []struct {
		name            string
		onRead, onWrite string
		send            string // after the head, once the CONNECT is answered
		cut             bool   // a swap cuts the tunnel while its 200 is written
		dials           bool   // the tunnel's upstream side was dialled, and must close
		component       string
		value           string
		want            string // what the client reads until the close
	}{
		{name: "reading the head", onRead: "CONNECT", component: componentFront, value: "test: read panics"},
		{name: "writing the 200", onWrite: "200 Connection established", dials: true, component: componentFront, value: "test: write panics"},
		{name: "writing the 200 as a swap cuts it", onWrite: "200 Connection established", cut: true, dials: true, component: componentFront, value: "test: write panics"},
		{name: "relaying upward", onRead: "boom", send: "boom", dials: true, component: componentTunnel, value: "test: read panics",
			want: "HTTP/1.1 200 Connection established\r\n\r\n"},
		{name: "relaying downward", onWrite: "boom", send: "boom", dials: true, component: componentTunnel, value: "test: write panics",
			want: "HTTP/1.1 200 Connection established\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.MaxConnections = 4 })
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
			var swapped chan struct{}
			var before func()
			if tc.cut {
				// A swap that refuses the tunnel cuts it while its 200 is on its way
				// out, and waits for that write, which panics.
				swapped = make(chan struct{})
				before = func() {
					go func() {
						h.apply(`{"network_mode":"allowlist","allowed_hosts":["b.test"]}`)
						close(swapped)
					}()
					waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
				}
			}
			upPort, upClosed := echoOnce(t, h.a.ip)
			c := h.servePanicking(t, tc.onRead, tc.onWrite, before)
			if _, err := fmt.Fprintf(c, "CONNECT a.test:%d HTTP/1.1\r\nHost: a.test\r\n\r\n", upPort); err != nil {
				t.Fatal(err)
			}
			if tc.send != "" {
				head := make([]byte, len(tc.want))
				if _, err := io.ReadFull(c, head); err != nil || string(head) != tc.want {
					t.Fatalf("answer %q, %v; want %q", head, err, tc.want)
				}
				if _, err := io.WriteString(c, tc.send); err != nil {
					t.Fatal(err)
				}
			}
			if rest, err := io.ReadAll(c); len(rest) > 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("after the panic the client read %q, %v; want the close alone", rest, err)
			}
			h.checkRecovered(t, tc.component, tc.value)
			if tc.dials {
				select {
				case <-upClosed:
				case <-time.After(hangGuard):
					t.Fatal("the tunnel's upstream socket outlives the panic")
				}
			}
			if swapped != nil {
				select {
				case <-swapped:
				case <-time.After(hangGuard):
					t.Fatal("the swap waits for a 200 the panic stopped")
				}
				h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
			}
			if status, _, body := h.get("http://a.test:" + fmt.Sprint(h.a.httpPort) + "/"); status != http.StatusOK || !strings.HasPrefix(body, "host=a.test") {
				t.Errorf("the next request: %d %q", status, body)
			}
		})
	}
}

// TestForwardRecoversPanic: a panic in the forward path (goproxy's handler) closes the
// connection after a 500 when nothing of the answer had gone out, and after nothing
// when something had: its 101 (the connection handed over to a relay the panic never
// started), or part of an informational answer that the panic cut short. Nothing stays
// open, and its slot is given back.
func TestForwardRecoversPanic(t *testing.T) {
	unwrap := func(w http.ResponseWriter) http.ResponseWriter {
		return w.(interface{ Unwrap() http.ResponseWriter }).Unwrap()
	}
	for _, tc := range []struct {
		name    string
		onWrite string // the client connection's writes panic on it (see panicConn)
		then    func(w http.ResponseWriter)
		value   string
		want    string
	}{
		{name: "before the answer", then: func(http.ResponseWriter) {}, value: "test: the handler panics",
			want: httpfront.ErrorAnswer("500 Internal Server Error", "internal-error")},
		{name: "after the hand-over", then: func(w http.ResponseWriter) {
			unwrap(w).WriteHeader(http.StatusSwitchingProtocols)
			if _, _, err := unwrap(w).(http.Hijacker).Hijack(); err != nil {
				panic(err)
			}
		}, value: "test: the handler panics", want: "HTTP/1.1 101 Switching Protocols\r\n"},
		{name: "in an informational answer", onWrite: "103 Early Hints", then: func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusEarlyHints)
		}, value: "test: write panics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				c.MaxConnections = 4
				c.wrapRelay = func(next http.Handler) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						tc.then(w)
						panic("test: the handler panics")
					})
				}
			})
			var c net.Conn
			if tc.onWrite != "" {
				c = h.servePanicking(t, "", tc.onWrite, nil)
			} else {
				c = h.dialProxy(t)
			}
			if _, err := fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", h.a.httpHostPort("a.test"), h.a.httpHostPort("a.test")); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if !strings.HasPrefix(string(got), tc.want) || tc.want == "" && len(got) > 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the client read %q, %v; want %q, then the close", got, err, tc.want)
			}
			// One panic: the recovery wrote nothing that could panic again.
			h.checkRecovered(t, componentFront, tc.value)
		})
	}
}

// panicWriter is a DNS response writer whose RemoteAddr (onAddr) or Write panics the
// first time; it records the messages written after that, and whether it was closed.
type panicWriter struct {
	onAddr bool
	mu     sync.Mutex
	calls  int
	got    []*dns.Msg
	closed bool
}

func (w *panicWriter) first() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	return w.calls == 1
}

func (w *panicWriter) LocalAddr() net.Addr { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53} }
func (w *panicWriter) RemoteAddr() net.Addr {
	if w.onAddr && w.first() {
		panic("test: the dns client's address panics")
	}
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}

func (w *panicWriter) WriteMsg(m *dns.Msg) error {
	data, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

func (w *panicWriter) Write(data []byte) (int, error) {
	if !w.onAddr && w.first() {
		panic("test: the dns write panics")
	}
	m := new(dns.Msg)
	if err := m.Unpack(data); err != nil {
		return 0, err
	}
	w.mu.Lock()
	w.got = append(w.got, m)
	w.mu.Unlock()
	return len(data), nil
}

func (w *panicWriter) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	return nil
}
func (w *panicWriter) TsigStatus() error   { return nil }
func (w *panicWriter) TsigTimersOnly(bool) {}
func (w *panicWriter) Hijack()             {}

// TestDNSRecoversPanic: a panic while answering one query is recovered (miekg/dns
// does not): counted, logged, answered SERVFAIL when nothing was written yet, and
// left unanswered (the writer closed: a TCP connection ends) when a write had begun;
// the query's slot is given back, and the next query is answered.
func TestDNSRecoversPanic(t *testing.T) {
	for _, tc := range []struct {
		name       string
		onAddr     bool
		value      string
		wantRcodes []int // of the messages written, the next query's answer included
		wantClosed bool
	}{
		{name: "writing the answer", value: "test: the dns write panics",
			wantRcodes: []int{dns.RcodeRefused}, wantClosed: true},
		{name: "before any write", onAddr: true, value: "test: the dns client's address panics",
			wantRcodes: []int{dns.RcodeServerFailure, dns.RcodeRefused}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			w := &panicWriter{onAddr: tc.onAddr}
			for range 2 {
				q := new(dns.Msg).SetQuestion("b.test.", dns.TypeA)
				q.SetEdns0(1232, false)
				h.srv.dns.ServeDNS(w, q)
			}
			var rcodes []int
			for _, m := range w.got {
				rcodes = append(rcodes, m.Rcode)
			}
			if fmt.Sprint(rcodes) != fmt.Sprint(tc.wantRcodes) || w.closed != tc.wantClosed {
				t.Errorf("written rcodes %v, closed %v; want %v, %v", rcodes, w.closed, tc.wantRcodes, tc.wantClosed)
			}
			if len(w.got) > 0 && w.got[0].Rcode == dns.RcodeServerFailure {
				if opt := w.got[0].IsEdns0(); opt == nil || len(opt.Option) != 1 ||
					opt.Option[0].(*dns.EDNS0_EDE).ExtraText != "compass-egress: "+dnsserver.ReasonInternalError {
					t.Errorf("SERVFAIL without the reason: %v", w.got[0])
				}
			}
			if n := h.srv.dns.Inflight(); n != 0 {
				t.Errorf("%d query slots still held", n)
			}
			line := ""
			for _, l := range strings.Split(h.logs.String(), "\n") {
				if strings.Contains(l, tc.value) {
					line = l
				}
			}
			for _, want := range []string{`"msg":"panic recovered"`, `"level":"ERROR"`, `"component":"dns"`, `"type":"dns"`, `"stack":"goroutine `} {
				if !strings.Contains(line, want) {
					t.Errorf("no %s in the panic's log line: %q", want, line)
				}
			}
			if m := h.metricsText(); !strings.Contains(m, `compass_proxy_panics_total{component="dns"} 1`) {
				t.Errorf("not counted:\n%s", grepLines(m, "panics"))
			}
			if resp := h.query("b.test", dns.TypeA, "udp"); resp.Rcode != dns.RcodeRefused {
				t.Errorf("the server's next answer: %v", resp)
			}
		})
	}
}

// TestDialRecoversPanic: a panic in the dial of a forwarded request, which the
// Transport runs on a goroutine of its own, fails that dial alone.
func TestDialRecoversPanic(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.dialControl = func(string, string, syscall.RawConn) error { panic("test: the dial panics") }
	})
	st := &requestState{ctx: context.Background(),
		verdict: Verdict{Allowed: true, Host: "a.test", Name: "a.test", Port: h.a.httpPort, Addrs: []netip.Addr{h.a.ip}}}
	ctx := withState(context.Background(), st)
	if c, err := h.srv.dialChecked(ctx, "tcp", ""); !errors.Is(err, errDialPanicked) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial: %v, want %v", err, errDialPanicked)
	}
	if m := h.metricsText(); !strings.Contains(m, `compass_proxy_panics_total{component="front"} 1`) {
		t.Errorf("not counted:\n%s", grepLines(m, "panics"))
	}
	if !strings.Contains(h.logs.String(), "test: the dial panics") {
		t.Errorf("not logged:\n%s", h.logs.String())
	}
}

// TestTrackerSweepPanicReleasesLock: a panic while a swap sweeps the live connections
// (in its re-decision or in a connection's close) reaches the control server's
// net/http, which recovers it; the tracker's lock must not stay held, or every later
// connection would wait on it.
func TestTrackerSweepPanicReleasesLock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cut   func(*liveConn) bool
		close func() func()
	}{
		{name: "in the re-decision", cut: func(*liveConn) bool { panic("test: recheck panics") },
			close: func() func() { return nil }},
		{name: "in a close", cut: func(*liveConn) bool { return true },
			close: func() func() { panic("test: close panics") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker()
			tr.add(&liveConn{typ: typeConnect, close: tc.close})
			func() {
				defer func() {
					if p := recover(); p == nil {
						t.Error("the sweep did not panic")
					}
				}()
				tr.closeIf(tc.cut)
			}()
			added := make(chan struct{})
			go func() {
				tr.add(&liveConn{typ: typeConnect})
				close(added)
			}()
			select {
			case <-added:
			case <-time.After(hangGuard):
				t.Fatal("the tracker's lock is still held after the sweep panicked")
			}
		})
	}
}

// TestRequestWatchRecoversPanic: a panic on a goroutine of a request's own that no
// handler's recover covers (the client watch's timer, goproxy's copies of a websocket
// relay, which read and write the client's connection through connio.IdleConn)
// cuts that request and its connection, as a panic on the connection's worker does,
// instead of ending the process: counted, logged, nothing of the request held, its
// upstream side closed.
func TestRequestWatchRecoversPanic(t *testing.T) {
	const upgrade = "GET http://ws.test:%d/ HTTP/1.1\r\nHost: ws.test:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	const switched = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	// wsEcho answers the upgrade with a 101, sends send, and reads until EOF, which it
	// reports on the channel.
	wsEcho := func(t *testing.T, h *harness, send string) (string, <-chan time.Time) {
		h.dns.set("ws.test", netip.MustParseAddr("127.0.0.9"))
		h.apply(`{"network_mode":"allowlist","allowed_hosts":["ws.test"]}`)
		closed := make(chan time.Time, 1)
		port := serveTCP(t, "127.0.0.9", func(c net.Conn, _ <-chan struct{}) {
			br := bufio.NewReader(c)
			if readHead(br) != nil {
				return
			}
			_, _ = io.WriteString(c, switched+send)
			_, _ = io.Copy(io.Discard, br)
			closed <- time.Now()
		}).Port
		return fmt.Sprintf(upgrade, port, port), closed
	}
	for _, tc := range []struct {
		name            string
		onRead, onWrite string
		// start sends the request (and reads a 101 the client is to see before
		// the panic); its channel reports the upstream side's close.
		start func(t *testing.T, h *harness, c net.Conn) <-chan time.Time
		value string
		want  string // what the client reads after start, until the close
	}{
		{name: "in the client watch", onRead: "!", value: "test: read panics",
			start: func(t *testing.T, h *harness, c net.Conn) <-chan time.Time {
				port, closed := quietUpstream(t, h, func(net.Conn, []byte) bool { return false })
				if _, err := io.WriteString(c, quietRequest(http.MethodGet, port, "", "")); err != nil {
					t.Fatal(err)
				}
				time.Sleep(4 * testWatchDelay) // the watch is reading
				// The start of a pipelined request, which the watch reads.
				if _, err := io.WriteString(c, "!"); err != nil {
					t.Fatal(err)
				}
				return closed
			}},
		{name: "in a websocket relay's read of the client", onRead: "boom", value: "test: read panics",
			start: func(t *testing.T, h *harness, c net.Conn) <-chan time.Time {
				req, closed := wsEcho(t, h, "")
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				head := make([]byte, len(switched))
				if _, err := io.ReadFull(c, head); err != nil || string(head) != switched {
					t.Fatalf("upgrade: %q, %v", head, err)
				}
				if _, err := io.WriteString(c, "boom"); err != nil {
					t.Fatal(err)
				}
				return closed
			}},
		{name: "in a websocket relay's write to the client", onWrite: "boom", value: "test: write panics", want: switched,
			start: func(t *testing.T, h *harness, c net.Conn) <-chan time.Time {
				req, closed := wsEcho(t, h, "boom")
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				return closed
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				c.MaxConnections = 4
				c.clientWatchDelay = testWatchDelay
			})
			c := h.servePanicking(t, tc.onRead, tc.onWrite, nil)
			upClosed := tc.start(t, h, c)
			got, err := io.ReadAll(c)
			if string(got) != tc.want || err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("after the panic the client read %q, %v; want %q, then the close", got, err, tc.want)
			}
			h.checkRecovered(t, componentFront, tc.value)
			upstreamClosed(t, upClosed)
		})
	}
}

// TestIdleTimerRecoversPanic: a panic in the timer of a request's wait for its answer
// head (connio.HeadWatch) or for its answer body's next bytes (connio.ReadWatch), which runs on a
// goroutine of its own, cuts that request (its connection closes, its context ends)
// instead of ending the process, and is counted and logged.
func TestIdleTimerRecoversPanic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(cl *requestClient, cancelled <-chan struct{})
	}{
		{name: "the answer head's", start: func(cl *requestClient, _ <-chan struct{}) {
			w := &connio.HeadWatch{}
			w.SetTimeout(time.Millisecond)
			w.Wrote(cl)
		}},
		{name: "the answer body's", start: func(cl *requestClient, cancelled <-chan struct{}) {
			w := &connio.ReadWatch{}
			w.SetTimeout(time.Millisecond)
			go func() {
				_, _ = w.Read(readerFunc(func([]byte) (int, error) { <-cancelled; return 0, io.EOF }), nil, cl)
			}()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			client, server := net.Pipe()
			defer client.Close()
			cancelled := make(chan struct{})
			calls := 0 // the timer's goroutine alone calls cancel
			// The idle request's cancellation panics: the stand-in for a bug in the
			// timer's check.
			cl := &requestClient{s: h.srv, conn: server, cancel: func() {
				if calls++; calls == 1 {
					panic("test: the idle timer panics")
				}
				close(cancelled)
			}}
			tc.start(cl, cancelled)
			select {
			case <-cancelled:
			case <-time.After(hangGuard):
				t.Fatal("the request was not cut")
			}
			if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Errorf("the client's connection: %v, want closed", err)
			}
			if m := h.metricsText(); !strings.Contains(m, `compass_proxy_panics_total{component="front"} 1`) {
				t.Errorf("not counted:\n%s", grepLines(m, "panics"))
			}
			if l := h.logs.String(); !strings.Contains(l, `"msg":"panic recovered"`) || !strings.Contains(l, "test: the idle timer panics") {
				t.Errorf("not logged:\n%s", l)
			}
		})
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// clearPanicConn is a connection whose first SetReadDeadline that clears the deadline
// panics.
type clearPanicConn struct {
	net.Conn
	once sync.Once
}

func (c *clearPanicConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() {
		c.once.Do(func() { panic("test: clearing the deadline panics") })
	}
	return c.Conn.SetReadDeadline(t)
}

// TestClientWatchPanicReleasesLock: a panic in the client watch while it holds its lock
// (readying the connection for its read) is recovered with the lock released: the
// request's end, which stops the watch, must not wait for it forever.
func TestClientWatchPanicReleasesLock(t *testing.T) {
	h := newHarness(t)
	client, server := net.Pipe()
	defer client.Close()
	cancelled := make(chan struct{})
	var left atomic.Bool
	cl := &requestClient{s: h.srv, conn: &clearPanicConn{Conn: server}, cancel: sync.OnceFunc(func() { close(cancelled) })}
	var w connio.GoneWatch
	w.Arm(cl.conn, cl, time.Millisecond, &left)
	select {
	case <-cancelled:
	case <-time.After(hangGuard):
		t.Fatal("the request was not cut")
	}
	stopped := make(chan struct{})
	go func() {
		w.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(hangGuard):
		t.Fatal("the watch's lock is still held after its panic")
	}
	if m := h.metricsText(); !strings.Contains(m, `compass_proxy_panics_total{component="front"} 1`) {
		t.Errorf("not counted:\n%s", grepLines(m, "panics"))
	}
	if left.Load() {
		t.Error("a panic taken for the client leaving")
	}
}

// closePanicConn is a connection whose first Close panics.
type closePanicConn struct {
	net.Conn
	once sync.Once
}

func (c *closePanicConn) Close() error {
	c.once.Do(func() { panic("test: close panics") })
	return c.Conn.Close()
}

// TestTunnelIdleWatchRecoversPanic: a panic in an idle tunnel's watch (here, in its
// close of the client's side) is counted and logged as the tunnel's, and both sides
// of the tunnel close, which ends its relay, whose end releases the rest.
func TestTunnelIdleWatchRecoversPanic(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = time.Millisecond })
	clientPeer, client := net.Pipe()
	defer clientPeer.Close()
	upPeer, up := net.Pipe()
	defer upPeer.Close()
	// No relay runs: the watch alone ends the tunnel.
	tun := &tunnel{upward: connio.NewDirection(up, &closePanicConn{Conn: client}, nil), downward: connio.NewDirection(client, up, nil),
		clientAddr: "127.0.0.1:40000"}
	h.srv.startTunnel(tun)
	defer tun.idle.Stop()
	for name, peer := range map[string]net.Conn{"client": clientPeer, "upstream": upPeer} {
		_ = peer.SetReadDeadline(time.Now().Add(hangGuard))
		if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("the tunnel's %s side: %v, want closed", name, err)
		}
	}
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), "test: close panics") })
	if m := h.metricsText(); !strings.Contains(m, `compass_proxy_panics_total{component="tunnel"} 1`) {
		t.Errorf("not counted:\n%s", grepLines(m, "panics"))
	}
	if l := h.logs.String(); !strings.Contains(l, `"client":"127.0.0.1:40000"`) {
		t.Errorf("not logged with the tunnel's client:\n%s", l)
	}
}
