package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
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
	accepted := make(chan struct{}, 1)
	target := serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) {
		select {
		case accepted <- struct{}{}:
		default:
		}
	})
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
	// The proxy's connect completes in the kernel's accept queue, before the
	// upstream's Accept returns: wait for it rather than count at once.
	select {
	case <-accepted:
	case <-time.After(hangGuard):
		t.Errorf("no connection reached the second address")
	}
	if !strings.Contains(h.logs.String(), `"addr":"127.0.0.2"`) {
		t.Errorf("no decision line names the address dialled: %s", h.logs.String())
	}
}

// TestDrainDeadlineBetweenDialAttempts: the drain's deadline that comes while a
// tunnel's first address is being tried stops the attempts that follow, not just the
// one in flight: the second address, which never answers, is not dialled for
// --dial-timeout, the drain returns, and no Warn line blames the upstream.
func TestDrainDeadlineBetweenDialAttempts(t *testing.T) {
	port := serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) {}).Port
	stalledListener(t, "127.0.0.5", port)
	d := holdFirstDial(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.6"), uint16(port)), func(c *Config) {
		// Long enough that a second attempt the deadline did not stop outlasts hangGuard.
		c.DialTimeout = 3 * hangGuard
	})
	d.h.dns.set("slow.test", netip.MustParseAddr("127.0.0.6"), netip.MustParseAddr("127.0.0.5"))
	d.h.apply(`{"network_mode":"allowlist","allowed_hosts":["slow.test"]}`)

	d.send(t, fmt.Sprintf("CONNECT slow.test:%d HTTP/1.1\r\n\r\n", port))
	d.drain()
	close(d.release)
	select {
	case <-d.shut:
	case <-time.After(hangGuard):
		t.Fatalf("the drain still waits %v after its deadline: the tunnel's next address is dialled", hangGuard)
	}
	if strings.Contains(d.h.logs.String(), `"msg":"dial failed"`) {
		t.Errorf("a Warn line blames the upstream: %s", d.h.logs.String())
	}
}

// TestDrainedDialIsNoPolicyRefusal: a tunnel whose dial the drain's deadline stopped
// tries no further address, so a swap that came meanwhile and refuses the next one does
// not turn the drain into a policy refusal: no denied line with policy-changed and
// nothing in the blocked list. (The client hears nothing either way: the drain has
// closed its connection.)
func TestDrainedDialIsNoPolicyRefusal(t *testing.T) {
	port := serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) {}).Port
	d := holdFirstDial(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.6"), uint16(port)), nil)
	// The name is allowed only through its addresses (IP rules); the swap below keeps
	// the first, so it does not cut the tunnel, and refuses the second.
	d.h.dns.set("two.test", netip.MustParseAddr("127.0.0.6"), netip.MustParseAddr("127.0.0.2"))
	d.h.apply(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.6","127.0.0.2"]}`)

	d.send(t, fmt.Sprintf("CONNECT two.test:%d HTTP/1.1\r\n\r\n", port))
	d.drain()
	d.h.apply(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.6"]}`)
	close(d.release)
	select {
	case <-d.shut:
	case <-time.After(hangGuard):
		t.Fatal("the drain did not return")
	}
	if logs := d.h.logs.String(); strings.Contains(logs, `"reason":"policy-changed"`) {
		t.Errorf("the drain's stop was logged as a policy refusal: %s", logs)
	}
	if got := d.h.srv.current.Load().blocked.Summary(0); got.Total != 0 {
		t.Errorf("blocked list %+v, want it empty", got)
	}
}

// heldDial is a proxy whose dial of one address is held in the dial's control hook,
// where no context reaches, until release is closed; then that attempt fails.
type heldDial struct {
	h                *harness
	c                net.Conn
	inFirst, release chan struct{}
	shut             chan struct{}
}

func holdFirstDial(t *testing.T, first netip.AddrPort, configure func(*Config)) *heldDial {
	d := &heldDial{inFirst: make(chan struct{}), release: make(chan struct{}), shut: make(chan struct{})}
	d.h = newHarness(t, func(c *Config) {
		if configure != nil {
			configure(c)
		}
		c.dialControl = func(network, address string, rc syscall.RawConn) error {
			if address == first.String() {
				close(d.inFirst)
				<-d.release
				return errors.New("test: the first address fails")
			}
			return loopbackOnly(network, address, rc)
		}
	})
	return d
}

// send writes a request on a new client connection and waits until the request's first
// address is held.
func (d *heldDial) send(t *testing.T, request string) {
	t.Helper()
	d.c = d.h.dialProxy(t)
	fmt.Fprint(d.c, request)
	select {
	case <-d.inFirst:
	case <-time.After(hangGuard):
		close(d.release)
		t.Fatal("the first address was never dialled")
	}
}

// drain starts a drain whose deadline has passed, so it cuts what is open at once, and
// returns once the cut has ended the client's request; shut closes when the drain
// returns.
func (d *heldDial) drain() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	go func() { _ = d.h.srv.Shutdown(ctx); close(d.shut) }()
	// The drain's deadline closes the client's connection, then ends its request,
	// both under the front's lock: once the close shows, Conns (which takes the lock)
	// waits for the end.
	buf := make([]byte, 512)
	for {
		if _, err := d.c.Read(buf); err != nil {
			break
		}
	}
	_ = d.h.srv.front.Conns()
}

// TestClientGoneDuringFailOver: a client that half-closes while the first of a name's
// two addresses is dialled ends the request, and with it the fail-over; the answer keeps
// the failed attempt's error, as for a name of one address: 502 dial-failed, whatever
// the number of addresses.
func TestClientGoneDuringFailOver(t *testing.T) {
	port := serveTCP(t, "127.0.0.2", func(net.Conn, <-chan struct{}) {}).Port
	d := holdFirstDial(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.6"), uint16(port)), func(c *Config) {
		c.clientWatchDelay = testWatchDelay
	})
	// Nothing listens on the second address: a dial of it is refused, a dial error too.
	d.h.dns.set("two.test", netip.MustParseAddr("127.0.0.6"), netip.MustParseAddr("127.0.0.7"))
	d.h.apply(`{"network_mode":"allowlist","allowed_hosts":["two.test"]}`)

	d.send(t, fmt.Sprintf("GET http://two.test:%d/ HTTP/1.1\r\nHost: two.test:%d\r\n\r\n", port, port))
	c := d.c
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		close(d.release)
		t.Fatal(err)
	}
	// The watch reads the half-close and ends the request. Were the sleep too short, the
	// second address would be dialled and refused, and the test would pass without
	// having tested anything: it cannot fail falsely.
	time.Sleep(10 * testWatchDelay)
	close(d.release)
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Compass-Egress"); resp.StatusCode != http.StatusBadGateway || got != "error; reason=dial-failed" {
		t.Errorf("answer %d %q, want 502 %q", resp.StatusCode, got, "error; reason=dial-failed")
	}
}
