package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestTunnelFailsOverPastAStalledAddress: each of a tunnel's dial attempts has
// --dial-timeout of its own, so a first address that never answers times out and the
// next one is dialled. A deadline shared by the attempts (or a timeout that stopped the
// dial for good) would leave none for the second address: a 502 for a destination that
// answers.
func TestTunnelFailsOverPastAStalledAddress(t *testing.T) {
	var accepted atomic.Int32
	target := serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) { accepted.Add(1) })
	stalledListener(t, "127.0.0.5", target.Port)
	h := newHarness(t, func(c *Config) { c.DialTimeout = 300 * time.Millisecond })
	h.dns.set("slow.test", netip.MustParseAddr("127.0.0.5"), netip.MustParseAddr("127.0.0.2"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)

	c := h.dialProxy(t)
	fmt.Fprintf(c, "CONNECT slow.test:%d HTTP/1.1\r\n\r\n", target.Port)
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	if got := string(buf[:n]); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("the client got %q, want the 200 of a tunnel to the second address", firstLine(got))
	}
	if accepted.Load() != 1 {
		t.Errorf("%d connection(s) reached the second address, want 1", accepted.Load())
	}
	if !strings.Contains(h.logs.String(), `"addr":"127.0.0.2"`) {
		t.Errorf("no decision line names the address dialled: %s", h.logs.String())
	}
}

// TestDrainDeadlineBetweenDialAttempts: the drain's deadline that comes while a
// tunnel's first address is being tried (here, held in the dial's control hook, where
// no context reaches) stops the attempts that follow, not just the one in flight: the
// second address, which never answers, is not dialled for --dial-timeout, the drain
// returns, and no Warn line blames the upstream.
func TestDrainDeadlineBetweenDialAttempts(t *testing.T) {
	port := serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) {}).Port
	stalledListener(t, "127.0.0.5", port)
	first := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.6"), uint16(port)).String()
	inFirst, release := make(chan struct{}), make(chan struct{})
	h := newHarness(t, func(c *Config) {
		// Long enough that a second attempt the deadline did not stop outlasts hangGuard.
		c.DialTimeout = 3 * hangGuard
		c.dialControl = func(network, address string, rc syscall.RawConn) error {
			if address == first {
				close(inFirst)
				<-release
				return errors.New("test: the first address fails")
			}
			return loopbackOnly(network, address, rc)
		}
	})
	h.dns.set("slow.test", netip.MustParseAddr("127.0.0.6"), netip.MustParseAddr("127.0.0.5"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)

	c := h.dialProxy(t)
	fmt.Fprintf(c, "CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port)
	select {
	case <-inFirst:
	case <-time.After(hangGuard):
		close(release)
		t.Fatal("the first address was never dialled")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has passed: the drain cuts what is still open at once
	shut := make(chan struct{})
	go func() { _ = h.srv.Shutdown(ctx); close(shut) }()
	// The drain's deadline closes the client's connection, then ends its request,
	// both under the front's lock: once the close shows, taking the lock waits for
	// the end.
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			break
		}
	}
	h.srv.front.mu.Lock()
	//lint:ignore SA2001 taking the lock waits for the drain's cut of every connection
	h.srv.front.mu.Unlock()
	close(release)
	select {
	case <-shut:
	case <-time.After(hangGuard):
		t.Fatalf("the drain still waits %v after its deadline: the tunnel's next address is dialled", hangGuard)
	}
	if strings.Contains(h.logs.String(), `"msg":"dial failed"`) {
		t.Errorf("a Warn line blames the upstream: %s", h.logs.String())
	}
}
