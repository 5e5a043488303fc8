package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTunnelHalfCloseAndEarlyBytes: bytes sent with the CONNECT arrive; the client's
// half-close reaches the upstream, whose answer still comes back after it; byte counts
// match what was sent.
func TestTunnelHalfCloseAndEarlyBytes(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	upBefore := testutil.ToFloat64(h.srv.metrics.bytes.WithLabelValues("upstream"))
	_, c := h.connect(h.a.echoHostPort("a.test"), "early-")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	if _, err := io.WriteString(c, "late"); err != nil {
		t.Fatal(err)
	}
	if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "early-late|eof after 10" {
		t.Fatalf("upstream echoed %q", out)
	}
	c.Close()
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.active.WithLabelValues(typeConnect)) == 0 })
	if got := testutil.ToFloat64(h.srv.metrics.bytes.WithLabelValues("upstream")) - upBefore; got != 10 {
		t.Fatalf("upstream bytes %v, want 10", got)
	}
	if !strings.Contains(h.logs.String(), `"msg":"tunnel closed"`) || !strings.Contains(h.logs.String(), `"bytes_up":10,"bytes_down":23`) {
		t.Fatalf("tunnel close line missing or wrong:\n%s", h.logs.String())
	}
}

// TestTunnelUpstreamHalfClose: the upstream's EOF reaches the client while the client
// can still send.
func TestTunnelUpstreamHalfClose(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	ln, err := net.Listen("tcp", "127.0.0.5:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "bye")
		_ = c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	_, c := h.connect(ln.Addr().String(), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	if b, err := io.ReadAll(c); err != nil || string(b) != "bye" {
		t.Fatalf("read %q %v", b, err)
	}
	if _, err := io.WriteString(c, "still here"); err != nil {
		t.Fatal(err)
	}
	_ = c.Conn.(*net.TCPConn).CloseWrite()
	if s := <-got; s != "still here" {
		t.Fatalf("upstream got %q", s)
	}
}

func TestDialFailureIs502(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	ln, err := net.Listen("tcp", "127.0.0.5:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	status, header := h.connectStatus(addr)
	if status != 502 || header != "error; reason=dial-failed" {
		t.Fatalf("%d %q", status, header)
	}
}

// TestWebsocketUpgrade: an Upgrade: websocket request is relayed both ways.
func TestWebsocketUpgrade(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	br := h.websocket(t, "a.test", 5*time.Second)
	// A swap that disallows a.test cuts the websocket too.
	if res := h.apply(`"no-network"`); res.ClosedConnections != 1 {
		t.Fatalf("closed %d", res.ClosedConnections)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("websocket still open under no-network")
	}
}

// TestHTTPForwarding: request bodies over one keep-alive connection.
func TestHTTPForwarding(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	for i := range 3 {
		resp, err := h.client.Post(fmt.Sprintf("http://a.test:%d/", h.a.httpPort), "text/plain", strings.NewReader(strings.Repeat("x", 1000*(i+1))))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), fmt.Sprintf("body=%d", 1000*(i+1))) {
			t.Fatalf("upstream saw %q", b)
		}
	}
}

// TestMaxConnections: connections beyond the bound wait until a slot frees.
func TestMaxConnections(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConnections = 1 })
	h.apply(`"public"`)
	_, first := h.connect(h.a.echoHostPort("a.test"), "")
	if first == nil {
		t.Fatal("first CONNECT refused")
	}
	second, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	fmt.Fprintf(second, "CONNECT %s HTTP/1.1\r\n\r\n", h.a.echoHostPort("a.test"))
	_ = second.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := second.Read(make([]byte, 1)); err == nil {
		t.Fatal("second connection served beyond the bound")
	}
	first.Close()
	_ = second.SetReadDeadline(time.Now().Add(hangGuard))
	resp, err := http.ReadResponse(bufio.NewReader(second), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("second after the first closed: %v %v", resp, err)
	}
}

// TestDrain: shutdown waits for a live tunnel, then cuts it at the deadline. The
// deadline is the context's end, which the test brings about itself once it has seen
// the tunnel work while draining: a timer would make that check race it.
func TestDrain(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	_, c := h.connect(h.a.echoHostPort("a.test"), "")
	if c == nil {
		t.Fatal("CONNECT refused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.srv.Shutdown(ctx) }()
	// While draining the tunnel still works and new connections are refused.
	waitFor(t, func() bool { ok, _ := h.srv.Ready(); return !ok })
	echoRoundTrip(t, c, "draining")
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) before its deadline, with a tunnel live", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		c.Close() // ends the tunnel, so that Shutdown and the test end
		<-done
		t.Fatalf("Shutdown still waited %v after its deadline: the tunnel was not cut", hangGuard)
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, errTimeout(err)) {
		t.Fatalf("tunnel survived the drain deadline: read %v", err)
	}
	if _, err := net.DialTimeout("tcp", h.srv.ProxyAddr().String(), time.Second); err == nil {
		t.Fatal("listener still accepting after shutdown")
	}
}

func TestMetricsEndpoint(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	h.connectStatus("b.test:443")
	h.query("a.test", 1, "udp")
	var body []byte
	// The DNS server counts a query after it has answered it.
	waitFor(t, func() bool {
		resp, err := http.Get("http://" + h.srv.MetricsAddr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(body), `compass_proxy_dns_queries_total{`)
	})
	// The admin socket serves the same registry.
	if admin := h.metricsText(); !strings.Contains(admin, `compass_proxy_policy_generation 2`) {
		t.Errorf("admin socket /metrics:\n%s", grepLines(admin, "generation"))
	}
	for _, want := range []string{
		`compass_proxy_requests_total{decision="denied",reason="not-allowlisted",type="connect"} 1`,
		`compass_proxy_dns_queries_total{decision="allowed",qtype="A"} 1`,
		`compass_proxy_active_connections{type="connect"} 0`,
		`compass_proxy_bytes_total{direction="upstream"}`,
		`compass_proxy_dial_duration_seconds_bucket`,
		`compass_proxy_policy_generation 2`,
		`compass_proxy_policy_reloads_total{result="success"} 2`,
		`compass_proxy_config_last_reload_successful 1`,
		`compass_proxy_build_info{`,
		`compass_proxy_swap_closed_connections_total 0`,
	} {
		// At the start of a line: "# HELP compass_proxy_config_last_reload_successful 1
		// if ..." would match the value 0 too.
		if !strings.Contains("\n"+string(body), "\n"+want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, path := range []string{"/livez", "/readyz"} {
		resp, err := http.Get("http://" + h.srv.MetricsAddr().String() + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
}

// Tunnels relaying at the same time, some past the size at which a direction moves to
// splice, some with early bytes, each ended by the client's half-close: every byte
// arrives in order, each tunnel is closed exactly once with its own counts, and the
// gauges and counters come back to what was sent.
func TestConcurrentTunnelsAccountEveryByte(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	upBefore := testutil.ToFloat64(h.srv.metrics.bytes.WithLabelValues("upstream"))
	const tunnels = 24
	type result struct {
		sent int
		err  error
	}
	results := make(chan result, tunnels)
	for i := range tunnels {
		early := strings.Repeat("e", i%3)
		_, c := h.connect(h.a.echoHostPort("a.test"), early)
		if c == nil {
			t.Fatal("CONNECT refused")
		}
		payload := strings.Repeat(fmt.Sprintf("%02d", i), i*3000) // 0 to 138 KB
		go func() {
			sent := len(early) + len(payload)
			want := early + payload + fmt.Sprintf("|eof after %d", sent)
			errc := make(chan error, 1)
			go func() {
				_, err := io.WriteString(c, payload)
				if err == nil {
					err = c.Conn.(*net.TCPConn).CloseWrite()
				}
				errc <- err
			}()
			out, err := io.ReadAll(c)
			if werr := <-errc; err == nil {
				err = werr
			}
			if err == nil && string(out) != want {
				err = fmt.Errorf("tunnel %d: %d bytes back, want %d", i, len(out), len(want))
			}
			c.Close()
			results <- result{sent, err}
		}()
	}
	total := 0
	for range tunnels {
		r := <-results
		if r.err != nil {
			t.Error(r.err)
		}
		total += r.sent
	}
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.active.WithLabelValues(typeConnect)) == 0 && h.srv.tracker.len() == 0
	})
	if got := testutil.ToFloat64(h.srv.metrics.bytes.WithLabelValues("upstream")) - upBefore; got != float64(total) {
		t.Errorf("upstream bytes %v, want %d", got, total)
	}
	closed := strings.Count(h.logs.String(), `"msg":"tunnel closed"`)
	if closed != tunnels {
		t.Errorf("%d tunnel closed lines, want %d", closed, tunnels)
	}
	for i := range tunnels {
		sent := i%3 + 2*i*3000
		if line := fmt.Sprintf(`"bytes_up":%d,"bytes_down":%d`, sent, sent+len(fmt.Sprintf("|eof after %d", sent))); !strings.Contains(h.logs.String(), line) {
			t.Errorf("no tunnel closed line with %s", line)
		}
	}
}
