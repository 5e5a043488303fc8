package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// wsUpstream answers one upgrade request with a websocket 101 on 127.0.0.9, then
// either discards what it is sent until EOF, reporting the EOF on eof, or (stuck)
// reads nothing until the test ends.
func wsUpstream(t *testing.T, h *harness, stuck bool, eof chan<- time.Time) int {
	t.Helper()
	h.dns.set("ws.test", netip.MustParseAddr("127.0.0.9"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["ws.test"]}`)
	return serveTCP(t, "127.0.0.9", func(c net.Conn, done <-chan struct{}) {
		br := bufio.NewReader(c)
		if readHead(br) != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		if stuck {
			<-done
			return
		}
		_, _ = io.Copy(io.Discard, br)
		eof <- time.Now()
	}).Port
}

// openWebsocket sends the upgrade request for ws.test:port and reads the 101.
func openWebsocket(t *testing.T, h *harness, port int) net.Conn {
	t.Helper()
	c := h.dialProxy(t)
	fmt.Fprintf(c, "GET http://ws.test:%d/ HTTP/1.1\r\nHost: ws.test:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", port, port)
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return c
}

// fillUpstream writes to c until the proxy's write to an upstream that reads nothing
// blocks, and gives the buffers a moment to fill.
func fillUpstream(c net.Conn) {
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
}

func TestWebsocketBytesAreCounted(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	up0, down0 := testutil.ToFloat64(h.srv.metrics.bytesUp), testutil.ToFloat64(h.srv.metrics.bytesDown)
	c := h.dialProxy(t)
	const early = "EARLY"
	fmt.Fprintf(c, "GET http://127.0.0.2:%d/ws HTTP/1.1\r\nHost: 127.0.0.2:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n%s", h.a.httpPort, h.a.httpPort, early)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	payload := strings.Repeat("x", 100000)
	go func() { _, _ = io.WriteString(c, payload) }()
	if _, err := io.ReadFull(br, make([]byte, len(early)+len(payload))); err != nil {
		t.Fatal(err)
	}
	c.Close()
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 })
	want := float64(len(early) + len(payload))
	if up, down := testutil.ToFloat64(h.srv.metrics.bytesUp)-up0, testutil.ToFloat64(h.srv.metrics.bytesDown)-down0; up != want || down < want {
		t.Fatalf("counted up %v down %v, want up %v and down at least %v (the 101 head included)", up, down, want, want)
	}
	// The gauge falls before the relay's end is logged.
	waitFor(t, func() bool { return len(logLines(h.logs.String(), "websocket closed")) > 0 })
	closed := logLines(h.logs.String(), "websocket closed")
	if len(closed) != 1 {
		t.Fatalf("%d websocket closed lines, want 1:\n%s", len(closed), h.logs.String())
	}
	if a := closed[0]["addr"]; a != "127.0.0.2" {
		t.Errorf("websocket closed line addr = %v, want the address dialled, 127.0.0.2", a)
	}
}

// A swap that cuts a websocket closes its upstream side.
func TestSwapClosesWebsocketUpstream(t *testing.T) {
	h := newHarness(t)
	eof := make(chan time.Time, 1)
	openWebsocket(t, h, wsUpstream(t, h, false, eof))
	if r := h.apply(`"no-network"`); r.ClosedConnections != 1 {
		t.Fatalf("closed %d connections, want 1", r.ClosedConnections)
	}
	select {
	case <-eof:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream side of the cut websocket is still open")
	}
}

type closeRecorder struct{ closed atomic.Bool }

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

// cut closes a relay's upstream side before it returns (a swap reports the connection
// closed when it returns), and a relay that begins after the cut is closed at once.
func TestRequestClientCutClosesRelayUpstream(t *testing.T) {
	for _, cutFirst := range []bool{false, true} {
		client, peer := net.Pipe()
		defer peer.Close()
		_, cancel := context.WithCancel(context.Background())
		rc := &requestClient{conn: client, cancel: cancel}
		up := &closeRecorder{}
		if cutFirst {
			rc.cut()
			rc.relay(up)
		} else {
			rc.relay(up)
			rc.cut()
		}
		if !up.closed.Load() {
			t.Errorf("cut first %v: the relay's upstream is open", cutFirst)
		}
	}
}

// A websocket whose upstream reads nothing (the relay blocked in a write to it) still
// ends: on a swap that refuses it, at the drain's deadline, when idle.
func TestWebsocketToStuckUpstreamEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(h *harness)
	}{
		{"swap", func(h *harness) { h.apply(`"no-network"`) }},
		{"drain deadline", func(h *harness) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_ = h.srv.Shutdown(ctx)
		}},
		{"idle", func(*harness) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = time.Second })
			c := openWebsocket(t, h, wsUpstream(t, h, true, nil))
			fillUpstream(c)
			tc.end(h)
			waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 })
		})
	}
}
