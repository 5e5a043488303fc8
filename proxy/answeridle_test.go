package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// answerIdle is the tunnel idle timeout of these tests: the bound on an answer that
// moves no byte.
const answerIdle = 300 * time.Millisecond

// stallUpstream serves stall.test on 127.0.0.21: per connection it reads one request
// (a POST carries a one-byte body), answers with a chunked head, runs body, and then
// waits for the proxy to close the connection, reporting when it did on closed.
func stallUpstream(t *testing.T, h *harness, body func(c net.Conn) error) (port int, closed <-chan time.Time) {
	t.Helper()
	h.dns.set("stall.test", netip.MustParseAddr("127.0.0.21"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["stall.test"]}`)
	ch := make(chan time.Time, 4)
	port = serveTCP(t, "127.0.0.21", func(c net.Conn, _ <-chan struct{}) {
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		if err != nil || readHead(br) != nil {
			return
		}
		if strings.HasPrefix(line, "POST") {
			if _, err := br.ReadByte(); err != nil {
				return
			}
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			return
		}
		if body(c) != nil {
			ch <- time.Now() // a write failed: the proxy closed the connection
			return
		}
		if _, err := io.Copy(io.Discard, br); err == nil || !errors.Is(err, net.ErrClosed) {
			ch <- time.Now()
		}
	}).Port
	return port, ch
}

// answerRequest is a request for stall.test through the upstream client (GET) or
// through net/http's Transport (POST, which has a body).
func answerRequest(method string, port int) string {
	if method == http.MethodPost {
		return fmt.Sprintf("POST http://stall.test:%d/ HTTP/1.1\r\nHost: stall.test:%d\r\nContent-Length: 1\r\n\r\nx", port, port)
	}
	return fmt.Sprintf("GET http://stall.test:%d/ HTTP/1.1\r\nHost: stall.test:%d\r\n\r\n", port, port)
}

// dialSmallWindow connects to the proxy with a small receive buffer, so that a client
// that reads slowly holds the proxy's writes back at once.
func dialSmallWindow(t *testing.T, h *harness) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10) })
		return errors.Join(err, serr)
	}}
	c, err := d.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// requestSettled waits for the proxy to give back what the request held, and for the
// one log line that says which side's silence ended it.
func requestSettled(t *testing.T, h *harness, side string) {
	t.Helper()
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.activeHTTP) == 0 && h.srv.tracker.len() == 0
	})
	want := `"msg":"answer idle"`
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), `"side":"`+side+`"`) })
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, want) && !strings.Contains(l, `"level":"WARN"`) {
			t.Fatalf("log line %s, want WARN", l)
		}
	}
}

// A client that stops reading an answer ends the request once no byte moved for the
// tunnel idle timeout: its connection closes without the answer's end, the upstream
// connection closes, the request's slot and gauge are given back.
func TestAnswerEndsWhenClientStopsReading(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			chunk := fmt.Sprintf("%x\r\n%s\r\n", 32<<10, strings.Repeat("x", 32<<10))
			port, closed := stallUpstream(t, h, func(c net.Conn) error {
				for {
					if _, err := io.WriteString(c, chunk); err != nil {
						return err
					}
				}
			})
			c := dialSmallWindow(t, h)
			start := time.Now()
			if _, err := io.WriteString(c, answerRequest(method, port)); err != nil {
				t.Fatal(err)
			}
			select {
			case at := <-closed:
				t.Logf("upstream connection closed %v after the request", at.Sub(start).Round(time.Millisecond))
			case <-time.After(hangGuard):
				t.Fatalf("upstream connection still open %v after the client stopped reading", hangGuard)
			}
			requestSettled(t, h, "client")
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("client read %v after %d bytes, want EOF (closed by the proxy)", err, len(got))
			}
			if strings.HasSuffix(string(got), "0\r\n\r\n") {
				t.Fatal("an answer cut by the idle bound ends with a last chunk")
			}
		})
	}
}

// A client that reads slowly but never stops for the timeout gets the whole answer,
// though each of the proxy's writes waits for it longer than the timeout.
func TestAnswerToSlowReaderCompletes(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
	const chunks = 4
	payload := strings.Repeat("y", 32<<10)
	port, _ := stallUpstream(t, h, func(c net.Conn) error {
		for range chunks {
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(payload), payload); err != nil {
				return err
			}
		}
		_, err := io.WriteString(c, "0\r\n\r\n")
		return err
	})
	c := dialSmallWindow(t, h)
	if _, err := io.WriteString(c, answerRequest(http.MethodGet, port)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(slowReader{c}), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || len(body) != chunks*len(payload) {
		t.Fatalf("slow reader got %d bytes, %v; want %d", len(body), err, chunks*len(payload))
	}
	t.Logf("slow reader took %v", time.Since(start).Round(time.Millisecond))
}

// slowReader reads at most 16 KiB every 100 ms.
type slowReader struct{ net.Conn }

func (r slowReader) Read(p []byte) (int, error) {
	time.Sleep(100 * time.Millisecond)
	return r.Conn.Read(p[:min(len(p), 16<<10)])
}

// An upstream that goes silent in the middle of an answer body ends the request once
// no byte moved for the tunnel idle timeout: the client sees the answer break off (no
// last chunk), the upstream connection closes.
func TestAnswerEndsWhenUpstreamGoesSilent(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			port, closed := stallUpstream(t, h, func(c net.Conn) error {
				_, err := io.WriteString(c, "4\r\npart\r\n")
				return err
			})
			c := h.dialProxy(t)
			if _, err := io.WriteString(c, answerRequest(method, port)); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			start := time.Now()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) || string(body) != "part" {
				t.Fatalf("client got %q, %v; want \"part\" and the answer broken off", body, err)
			}
			t.Logf("answer broken off %v after the request", time.Since(start).Round(time.Millisecond))
			select {
			case <-closed:
			case <-time.After(hangGuard):
				t.Fatalf("upstream connection still open %v after the answer broke off", hangGuard)
			}
			requestSettled(t, h, "upstream")
		})
	}
}

// An upstream that sends its answer slowly, never quiet for the timeout, is relayed
// whole.
func TestAnswerFromSlowUpstreamCompletes(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
			const ticks = 12
			port, _ := stallUpstream(t, h, func(c net.Conn) error {
				for range ticks {
					time.Sleep(answerIdle / 3)
					if _, err := io.WriteString(c, "4\r\ntick\r\n"); err != nil {
						return err
					}
				}
				_, err := io.WriteString(c, "0\r\n\r\n")
				return err
			})
			c := h.dialProxy(t)
			if _, err := io.WriteString(c, answerRequest(method, port)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != strings.Repeat("tick", ticks) {
				t.Fatalf("client got %q, %v; want %d ticks", body, err, ticks)
			}
		})
	}
}

// A connection whose answer set a write deadline hands it over without one: a tunnel
// after a forwarded request on the same connection, and a websocket relay, carry
// traffic for longer than the deadline would have allowed.
func TestHandedOverConnectionKeepsNoAnswerDeadline(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = answerIdle })
	h.apply(`"public"`)
	// pings sends a line every third of the timeout for three timeouts, each echoed.
	pings := func(t *testing.T, c net.Conn, br *bufio.Reader) {
		t.Helper()
		for i := range 9 {
			time.Sleep(answerIdle / 3)
			msg := fmt.Sprintf("ping%d", i)
			if _, err := io.WriteString(c, msg); err != nil {
				t.Fatalf("ping %d: %v", i, err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
				t.Fatalf("ping %d: %q %v", i, got, err)
			}
		}
	}

	t.Run("tunnel", func(t *testing.T) {
		c := h.dialProxy(t)
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET http://127.0.0.2:%d/ HTTP/1.1\r\nHost: 127.0.0.2:%d\r\n\r\n", h.a.httpPort, h.a.httpPort)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		target := h.a.echoHostPort("127.0.0.2")
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		pings(t, c, br)
	})

	t.Run("websocket", func(t *testing.T) {
		c := h.dialProxy(t)
		fmt.Fprintf(c, "GET http://127.0.0.2:%d/ws HTTP/1.1\r\nHost: 127.0.0.2:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", h.a.httpPort, h.a.httpPort)
		br := bufio.NewReader(c)
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		pings(t, c, br)
	})
}
