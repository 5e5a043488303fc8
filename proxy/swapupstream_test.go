package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// peerClosed reports whether c's peer, a socket of this process's proxy, has been
// closed, without waiting. It reads the peer socket's TCP state, which close(2) changes
// before it returns; the FIN itself may reach c later, when loopback delivery runs in
// ksoftirqd under load, so c's own view would race the close it is meant to order.
func peerClosed(t *testing.T, c net.Conn) bool {
	t.Helper()
	fields, found := procTCPSocket(t, c.RemoteAddr().(*net.TCPAddr).AddrPort(), c.LocalAddr().(*net.TCPAddr).AddrPort())
	return !found || fields[3] != tcpEstablished && fields[3] != tcpCloseWait
}

// TCP states as /proc/net/tcp numbers them (include/net/tcp_states.h).
const (
	tcpEstablished = "01"
	tcpCloseWait   = "08"
)

// TestSwapClosesUpstreamBeforeReturning: a forwarded HTTP request in flight that the
// new policy refuses has its upstream connection closed by the time the swap returns,
// not a moment later when the request's cancellation gets round to it: a connection
// opened under public must not outlive the switch to no-network. Both forwarding paths:
// the proxy's own client (a GET) and net/http's Transport (a request with a body).
func TestSwapClosesUpstreamBeforeReturning(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
	}{{"own client", "GET", ""}, {"transport", "POST", "hello"}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			conns := make(chan net.Conn, 1)
			addr := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ntick\n\r\n")
				conns <- c
				<-done
			})
			h.apply(`"public"`)
			c := h.dialProxy(t)
			fmt.Fprintf(c, "%s http://a.test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\nContent-Length: %d\r\n\r\n%s",
				tc.method, addr.Port, addr.Port, len(tc.body), tc.body)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
				t.Fatal(err)
			}
			up := <-conns
			if peerClosed(t, up) { // else the check below could not fail
				t.Fatal("the upstream connection is not found open before the swap")
			}
			if res := h.apply(`"no-network"`); res.ClosedConnections != 1 {
				t.Fatalf("closed %d connections, want 1", res.ClosedConnections)
			}
			if !peerClosed(t, up) {
				t.Fatal("the upstream connection is still open after the swap returned")
			}
		})
	}
}

// A pooled upstream connection that went on to request b is b's: a cut of request a,
// which sent on it before, leaves it open; b's cut closes it.
func TestHeldConnBelongsToItsLastRequest(t *testing.T) {
	s := &Server{}
	c, peer := net.Pipe()
	defer peer.Close()
	a, b := &requestClient{}, &requestClient{}
	s.hold(a, c)
	s.hold(b, c) // a's answer ended, the connection went back to the pool, b took it
	s.closeHeld(a)
	// A net.Pipe end refuses a deadline once closed.
	if err := c.SetDeadline(time.Time{}); err != nil {
		t.Fatalf("a's cut closed b's connection: %v", err)
	}
	s.release(a)
	s.closeHeld(b)
	if err := c.SetDeadline(time.Time{}); err == nil {
		t.Fatal("b's cut left its connection open")
	}
	if _, ok := s.held.Load(c); ok {
		t.Fatal("a closed connection is still held")
	}
}

// TestPutClosesLiveTunnelBeforeAnswering: through the admin socket, as the controller
// swaps: by the time the answer to the PUT arrives, a tunnel opened under public is
// closed on both sides, and the answer counts it.
func TestPutClosesLiveTunnelBeforeAnswering(t *testing.T) {
	h := newHarness(t)
	ups := make(chan net.Conn, 1)
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		ups <- c
		<-done
	})
	h.apply(`"public"`)
	_, tc := h.connect(addr.String(), "")
	if tc == nil {
		t.Fatal("CONNECT refused")
	}
	up := <-ups
	if peerClosed(t, up) || peerClosed(t, tc.Conn) { // else the checks below could not fail
		t.Fatal("the tunnel is not found open on both sides before the PUT")
	}
	code, got := h.admin("PUT", "/v1/policy", `"no-network"`)
	if code != http.StatusOK || got["closed_connections"] != float64(1) {
		t.Fatalf("PUT no-network: %d %v, want 200 with closed_connections 1", code, got)
	}
	if !peerClosed(t, up) {
		t.Error("the tunnel's upstream side is still open after the PUT was answered")
	}
	if !peerClosed(t, tc.Conn) {
		t.Error("the tunnel's client side is still open after the PUT was answered")
	}
}

// TestSwapClosesIdleUpstreamConnections: a keep-alive upstream connection left idle in
// the old generation's pool by a finished request is closed by the time the swap
// returns: a connection opened under public must not outlive the switch to no-network,
// idle or not.
func TestSwapClosesIdleUpstreamConnections(t *testing.T) {
	h := newHarness(t)
	conns := make(chan net.Conn, 1)
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		conns <- c
		<-done
	})
	old := h.apply(`"public"`)
	resp, err := h.client.Get(fmt.Sprintf("http://a.test:%d/", addr.Port))
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(resp.Body); err != nil || string(body) != "ok" {
		t.Fatalf("body %q %v", body, err)
	}
	resp.Body.Close()
	up := <-conns
	// The answer read to its end gives the connection back to the generation's pool.
	rs := h.srv.Current()
	if rs.Generation != old.Generation {
		t.Fatalf("generation %d, want %d", rs.Generation, old.Generation)
	}
	waitFor(t, func() bool { return rs.upstream.IdleConns() == 1 })
	h.apply(`"no-network"`)
	if !peerClosed(t, up) {
		t.Fatal("the idle upstream connection outlived the swap")
	}
}
