package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// floodingTunnel opens a tunnel under a tunnel idle timeout of idle to an upstream that
// sends until the proxy closes the tunnel, which closes ended.
func floodingTunnel(t *testing.T, idle time.Duration) (h *harness, tc *tunnelConn, ended <-chan struct{}) {
	t.Helper()
	h = newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)
	done := make(chan struct{})
	addr := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return // the proxy closed the tunnel
			}
		}
	})
	_, tc = h.connect(addr.String(), "")
	if tc == nil {
		t.Fatal("CONNECT refused")
	}
	return h, tc, done
}

// TestTunnelIdleWithBlockedWrites: directions blocked in writes that no read deadline
// bounds move no byte, so the tunnel idle timeout must still close the tunnel: a
// client that half-closes and then reads nothing (one direction ended with EOF, the
// other blocked writing to it), and a client and an upstream that both send and
// neither reads (both blocked).
func TestTunnelIdleWithBlockedWrites(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		stall func(t *testing.T, c *tunnelConn)
	}{
		{"half-closed client that reads nothing", func(t *testing.T, c *tunnelConn) {
			if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}},
		{"both peers send and neither reads", func(_ *testing.T, c *tunnelConn) {
			go func() { _, _ = io.Copy(c, zeros{}) }() // until its writes block for good
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, c, ended := floodingTunnel(t, idle)
			tc.stall(t, c)
			select {
			case <-ended:
			case <-time.After(hangGuard):
				t.Fatalf("tunnel still open %v after its last byte (idle timeout %v); active tunnels %v",
					hangGuard, idle, testutil.ToFloat64(h.srv.metrics.activeConnect))
			}
			waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })
		})
	}
}

// TestKeepAliveLeavesTheIdleWatchRunning: the watch that cuts a tunnel whose writes
// are blocked also turns on the upstream's keep-alive. One due before the first idle
// check must leave the checks running, so the tunnel is still cut.
func TestKeepAliveLeavesTheIdleWatchRunning(t *testing.T) {
	const idle = 300 * time.Millisecond
	saved := tunnelKeepAliveAfter
	tunnelKeepAliveAfter = idle / 6 // read by startTunnel
	h, c, ended := floodingTunnel(t, idle)
	defer func() {
		// Restored once the tunnel is gone: its end takes the tracker's lock, as len does.
		c.Close()
		waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
		tunnelKeepAliveAfter = saved
	}()
	if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(hangGuard):
		t.Fatalf("tunnel still open %v after its last byte (idle timeout %v, keep-alive after %v)",
			hangGuard, idle, idle/6)
	}
}

// zeros reads as an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestTunnelSlowReaderIsNotIdle: a download that the client reads slowly but steadily
// moves bytes all the time, so the tunnel idle timeout must not cut it, even when one
// spliced chunk takes longer than the timeout to reach the client.
func TestTunnelSlowReaderIsNotIdle(t *testing.T) {
	const idle = 500 * time.Millisecond
	_, tc, cut := floodingTunnel(t, idle)
	// 16 KiB every 10 ms (about 1.6 MB/s) for six idle timeouts: progress all the
	// time, yet slower than loopback fills a 1 MiB splice. What the client has not read
	// yet is mostly in the kernel's buffers, so a cut shows at the upstream first.
	buf := make([]byte, 16<<10)
	got := 0
	for end := time.Now().Add(6 * idle); time.Now().Before(end); {
		n, err := io.ReadFull(tc, buf)
		got += n
		if err != nil {
			t.Fatalf("read after %d bytes: %v", got, err)
		}
		select {
		case <-cut:
			t.Fatalf("tunnel cut as idle while the client read steadily (%d bytes read)", got)
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startSink serves one-way traffic on 127.0.0.2: it reads until a line "end", then
// answers how many bytes came before it.
func startSink(t *testing.T) string {
	t.Helper()
	return serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		r := bufio.NewReader(c)
		n := 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if line == "end\n" {
				fmt.Fprintf(c, "got %d\n", n)
				return
			}
			n += len(line)
		}
	}).String()
}

// TestTunnelIdleTimeout: a tunnel with no byte either way is closed after the idle
// timeout; one with traffic in one direction only lives on, however long the other
// stays quiet.
func TestTunnelIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)

	t.Run("idle", func(t *testing.T) {
		_, tc := h.connect(h.a.echoHostPort("127.0.0.2"), "")
		if tc == nil {
			t.Fatal("CONNECT refused")
		}
		echoRoundTrip(t, tc, "ping")
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := tc.Read(make([]byte, 1))
		if !errors.Is(err, io.EOF) {
			t.Fatalf("idle tunnel: read %v, want EOF (closed by the proxy)", err)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		br := h.websocket(t, "127.0.0.2", 10*time.Second)
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("idle websocket: read %v, want EOF (closed by the proxy)", err)
		}
	})

	t.Run("one-way", func(t *testing.T) {
		_, tc := h.connect(startSink(t), "")
		if tc == nil {
			t.Fatal("CONNECT refused")
		}
		sent := 0
		for end := time.Now().Add(4 * idle); time.Now().Before(end); {
			n, err := io.WriteString(tc, "x\n")
			if err != nil {
				t.Fatalf("write after %d bytes: %v", sent, err)
			}
			sent += n
			time.Sleep(idle / 6)
		}
		if _, err := io.WriteString(tc, "end\n"); err != nil {
			t.Fatal(err)
		}
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(tc).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != fmt.Sprintf("got %d", sent) {
			t.Fatalf("one-way tunnel: %q %v, want got %d", line, err, sent)
		}
	})
}

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

// A tunnel that outlives tunnelKeepAliveAfter gets TCP keep-alive on its upstream
// socket, which keeps NAT and firewall state on the way alive while it idles (the
// client's keep-alive probes stop at the proxy); one that ends sooner never pays for the
// setsockopt calls. The kernel shows a socket's armed keep-alive timer as timer kind 2
// in /proc/net/tcp.
func TestLongTunnelsKeepTheirUpstreamAlive(t *testing.T) {
	saved := tunnelKeepAliveAfter
	tunnelKeepAliveAfter = 500 * time.Millisecond
	h := newHarness(t)
	h.apply(`"public"`)
	peers := make(chan string, 1)
	up := serveTCP(t, "127.0.0.2", func(c net.Conn, _ <-chan struct{}) {
		peers <- c.RemoteAddr().String()
		_, _ = io.Copy(io.Discard, c) // until the client's end comes through the tunnel
	})
	resp, c := h.connect(up.String(), "")
	if c == nil {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	defer func() {
		// Restored once the tunnel's goroutine, which read it, is done (its end takes
		// the tracker's lock, which len takes too).
		c.Close()
		waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
		tunnelKeepAliveAfter = saved
	}()
	proxySide := netip.MustParseAddrPort(<-peers)
	upstream := up.AddrPort()
	if kind := tcpTimerKind(t, proxySide, upstream); kind != 0 {
		t.Fatalf("timer kind %d on a new tunnel's upstream socket, want 0 (no keep-alive yet)", kind)
	}
	waitFor(t, func() bool { return tcpTimerKind(t, proxySide, upstream) == 2 })
}

// tcpTimerKind is the timer kind ("tr") /proc/net/tcp shows for the IPv4 socket from
// local to remote: 0 none, 1 retransmission, 2 keep-alive, 3 TIME_WAIT, 4 window probe.
func tcpTimerKind(t *testing.T, local, remote netip.AddrPort) int {
	t.Helper()
	fields, found := procTCPSocket(t, local, remote)
	if !found {
		t.Fatalf("no socket %s -> %s in /proc/net/tcp", local, remote)
	}
	kind, err := strconv.ParseInt(strings.SplitN(fields[5], ":", 2)[0], 16, 32)
	if err != nil {
		t.Fatalf("timer field %q: %v", fields[5], err)
	}
	return int(kind)
}
