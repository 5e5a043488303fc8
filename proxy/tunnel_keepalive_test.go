package proxy

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
