package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// stalledListener listens on ip:port with a backlog of 0 and fills its accept queue, so
// that the kernel drops the SYNs of a further connect, which then waits until its
// dialer gives up. It returns the non-blocking listening socket and how many
// connections fill the queue.
func stalledListener(t *testing.T, ip string, port int) (fd, queued int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: netip.MustParseAddr(ip).As4()}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(ip, fmt.Sprint(port))
	for ; ; queued++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return fd, queued // the queue is full
		}
		t.Cleanup(func() { c.Close() })
	}
}

// slowDestination starts a harness whose policy allows slow.test, a name that resolves
// to 127.0.0.5 alone, where a stalledListener drops every SYN on a port that 127.0.0.2
// also serves (so the port is free on both). It returns the harness, the port, and the
// stalled listener's descriptor and queue for tests that later let a dial through.
func slowDestination(t *testing.T, dialTimeout time.Duration) (h *harness, port, fd, queued int) {
	t.Helper()
	port = serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) {}).Port
	fd, queued = stalledListener(t, "127.0.0.5", port)
	h = newHarness(t, func(c *Config) { c.DialTimeout = dialTimeout })
	h.dns.set("slow.test", netip.MustParseAddr("127.0.0.5"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)
	return h, port, fd, queued
}

// TestSwapStopsADialInProgress: a request decided under a policy that allows its name,
// whose dial waits on a first address that does not answer when a swap refuses it,
// opens no connection to its next address once the swap has returned: the tunnel or
// request is live from its dial on, and each address is admitted under the rule set in
// force before it is dialled. The policies after the swap refuse the dial either
// through the sweep (no-network) or only at the next address (an IP rule that keeps
// the first one).
func TestSwapStopsADialInProgress(t *testing.T) {
	for _, tc := range []struct {
		name, after string
		request     func(port int) string
		answer      string // the start of the client's answer
	}{
		{"CONNECT/no-network", `"no-network"`, func(port int) string {
			return fmt.Sprintf("CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port)
		}, "HTTP/1.1 403"},
		{"CONNECT/first address only", `{"network_mode":"allowlist","allowed_hosts":["127.0.0.5"]}`, func(port int) string {
			return fmt.Sprintf("CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port)
		}, "HTTP/1.1 403"},
		{"GET/no-network", `"no-network"`, func(port int) string {
			return fmt.Sprintf("GET http://slow.test:%d/ HTTP/1.1\r\nHost: slow.test:%d\r\n\r\n", port, port)
		}, ""},
		{"GET/first address only", `{"network_mode":"allowlist","allowed_hosts":["127.0.0.5"]}`, func(port int) string {
			return fmt.Sprintf("GET http://slow.test:%d/ HTTP/1.1\r\nHost: slow.test:%d\r\n\r\n", port, port)
		}, "HTTP/1.1 403"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var accepted atomic.Int32
			target := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
				accepted.Add(1)
				<-done
			})
			stalledListener(t, "127.0.0.5", target.Port)
			h := newHarness(t, func(c *Config) { c.DialTimeout = time.Second })
			h.dns.set("slow.test", netip.MustParseAddr("127.0.0.5"), netip.MustParseAddr("127.0.0.2"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)

			c := h.dialProxy(t)
			if _, err := c.Write([]byte(tc.request(target.Port))); err != nil {
				t.Fatal(err)
			}
			// Decided before the dial, which then waits on the first address for a
			// second.
			h.waitLive(t)
			h.apply(tc.after)
			before := accepted.Load()
			buf := make([]byte, 512)
			n, _ := c.Read(buf)
			time.Sleep(100 * time.Millisecond) // a connection opened late shows by now
			if opened := accepted.Load() - before; opened != 0 {
				t.Fatalf("%d connection(s) opened to 127.0.0.2 after the swap returned", opened)
			}
			if got := string(buf[:n]); !strings.HasPrefix(got, tc.answer) {
				t.Fatalf("the client got %q, want an answer starting %q", firstLine(got), tc.answer)
			}
		})
	}
}

// TestCutStopsATransportDial: net/http's Transport (requests with a body, https://
// URIs, upgrades) dials under a context detached from the request's, so cutting the
// request alone would leave its dial running, to open once the destination answers;
// the request's end is joined back into the dial. The cut here is the sweep's alone,
// without the idle-pool close a swap also does.
func TestCutStopsATransportDial(t *testing.T) {
	h, port, fd, queued := slowDestination(t, 5*time.Second)
	c := h.dialProxy(t)
	if _, err := fmt.Fprintf(c, "POST http://slow.test:%d/ HTTP/1.1\r\nHost: slow.test:%d\r\nContent-Length: 1\r\n\r\nx", port, port); err != nil {
		t.Fatal(err)
	}
	h.waitLive(t)
	time.Sleep(100 * time.Millisecond) // the dial's first SYN is dropped
	if n := h.srv.tracker.closeIf(func(*liveConn) bool { return true }); n != 1 {
		t.Fatalf("the cut found %d live requests, want 1", n)
	}
	if opened := openedAfterCut(fd, queued); opened > 0 {
		t.Fatalf("%d connection(s) opened to 127.0.0.5 after the request was cut", opened)
	}
}

// openedAfterCut empties the accept queue of a stalledListener (queued connections are
// the test's own) and counts the connections that come in over the next 2.5 s: a dial
// still running gets through on its next SYN, about a second after its first.
func openedAfterCut(fd, queued int) int {
	opened := -queued
	for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline); {
		if nfd, _, err := syscall.Accept(fd); err == nil {
			opened++
			syscall.Close(nfd)
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	return opened
}
