package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// A websocket whose bytes go one way only is not idle: each byte the client sends
// (up) or is sent (down) is a sign of life, however long the other way stays quiet, and
// every byte arrives.
func TestOneWayWebsocketIsNotIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, down := range []bool{false, true} {
		name := "up"
		if down {
			name = "down"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
			h.dns.set("ws.test", netip.MustParseAddr("127.0.0.9"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["ws.test"]}`)
			upstream := make(chan int, 1) // bytes the upstream sent (down) or received (up)
			port := serveTCP(t, "127.0.0.9", func(c net.Conn, done <-chan struct{}) {
				br := bufio.NewReader(c)
				if readHead(br) != nil {
					return
				}
				if _, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"); err != nil {
					return
				}
				if !down {
					n, _ := io.Copy(io.Discard, br)
					upstream <- int(n)
					return
				}
				sent := 0
				for end := time.Now().Add(4 * idle); time.Now().Before(end); sent++ {
					select {
					case <-done:
						return
					case <-time.After(idle / 6):
					}
					if _, err := io.WriteString(c, "x"); err != nil {
						break
					}
				}
				upstream <- sent
			}).Port
			c := h.dialProxy(t)
			fmt.Fprintf(c, "GET http://ws.test:%d/ HTTP/1.1\r\nHost: ws.test:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", port, port)
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			got := 0
			if down {
				b, err := io.ReadAll(br) // until the upstream's close, relayed
				if err != nil {
					t.Fatal(err)
				}
				got = len(b)
			} else {
				for end := time.Now().Add(4 * idle); time.Now().Before(end); got++ {
					time.Sleep(idle / 6)
					if _, err := io.WriteString(c, "x"); err != nil {
						t.Fatalf("write after %d bytes: %v", got, err)
					}
				}
				_ = c.(*net.TCPConn).CloseWrite()
			}
			var want int
			select {
			case want = <-upstream:
			case <-time.After(hangGuard):
				t.Fatal("the upstream did not finish")
			}
			if !down {
				got, want = want, got
			}
			if got != want {
				t.Fatalf("%d of %d bytes arrived: the relay was cut as idle", got, want)
			}
		})
	}
}

// A relay is cut a whole timeout after its last sign of life, and its start is one: a
// tunnel or websocket that never carries a byte lives the timeout out. When the cut
// comes is checked as a lower bound only: a loaded machine can only make it later.
func TestQuietRelayLivesTheTimeout(t *testing.T) {
	const idle = time.Second
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)
	for _, tc := range []struct {
		name string
		open func(t *testing.T) io.Reader
	}{
		{"tunnel", func(t *testing.T) io.Reader {
			_, tc := h.connect(h.a.echoHostPort("127.0.0.2"), "")
			if tc == nil {
				t.Fatal("CONNECT refused")
			}
			return tc
		}},
		{"websocket", func(t *testing.T) io.Reader {
			c := h.dialProxy(t)
			fmt.Fprintf(c, "GET http://127.0.0.2:%d/ws HTTP/1.1\r\nHost: 127.0.0.2:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", h.a.httpPort, h.a.httpPort)
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			return br
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := tc.open(t)
			if _, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("read %v, want EOF (closed by the proxy)", err)
			}
			if took := time.Since(start); took < idle {
				t.Fatalf("a relay that carried nothing was cut after %v, before the idle timeout %v", took, idle)
			}
		})
	}
}
