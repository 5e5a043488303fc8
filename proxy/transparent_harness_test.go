package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/net/origdst"
)

// transparentHarness is a harness whose proxy also has a transparent listener. The
// kernel's redirection is faked: each client connection's original destination is
// the one dialTransparent registered for it. Its clock (of the names the DNS server
// answered) moves only with advance.
type transparentHarness struct {
	*harness
	mu    sync.Mutex
	dsts  map[string]netip.AddrPort // client address → original destination
	start time.Time
	skew  atomic.Int64
}

// Test bounds of the transparent listener: short, so tests of a client that sends
// nothing, or of an idle tunnel, are quick.
const (
	testSniffWait   = 100 * time.Millisecond
	testTunnelIdle  = 2 * time.Second
	transparentHost = "127.0.0.1:0"
)

func newTransparentHarness(t testing.TB, tune ...func(*Config)) *transparentHarness {
	t.Helper()
	th := &transparentHarness{dsts: map[string]netip.AddrPort{}, start: time.Now()}
	th.harness = newHarness(t, append([]func(*Config){func(c *Config) {
		c.TransparentListen = transparentHost
		c.origDst = th.lookup
		c.transparentSniffWait = testSniffWait
		c.now = th.now
	}}, tune...)...)
	return th
}

func (th *transparentHarness) now() time.Time {
	return time.Now().Add(time.Duration(th.skew.Load()))
}

// advance moves the clock of the learned names on by d.
func (th *transparentHarness) advance(d time.Duration) { th.skew.Add(int64(d)) }

// lookup is the faked origdst.Lookup: it waits for the test to register the client.
func (th *transparentHarness) lookup(c *net.TCPConn) (netip.AddrPort, error) {
	key := c.RemoteAddr().String()
	for deadline := time.Now().Add(hangGuard); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		th.mu.Lock()
		dst, ok := th.dsts[key]
		th.mu.Unlock()
		if ok && !dst.IsValid() {
			return netip.AddrPort{}, origdst.ErrNotRedirected
		}
		if ok {
			return dst, nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("test: no destination registered for %s", key)
}

// dial connects from src (a loopback address) to the transparent listener as a
// connection redirected from dst (zero: not redirected; "listener": the listener's own).
func (th *transparentHarness) dial(t *testing.T, src string, dst netip.AddrPort) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", th.srv.TransparentAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	th.mu.Lock()
	th.dsts[c.LocalAddr().String()] = dst
	th.mu.Unlock()
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	return c.(*net.TCPConn)
}

// resolve asks the proxy's DNS server for name's A records from src, as an agent's
// lookup before a connection that names nothing; it reports whether it was answered.
func (th *transparentHarness) resolve(t *testing.T, src, name string) bool {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c := &dns.Client{Timeout: hangGuard, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}}
	resp, _, err := c.Exchange(m, th.srv.DNSAddr().String())
	if err != nil {
		t.Fatalf("dns %s from %s: %v", name, src, err)
	}
	return resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0
}

// echoes sends msg on c, half-closes, and reports whether the echo upstream answered
// with msg and its end marker (the connection was relayed both ways).
func echoes(c *net.TCPConn, msg []byte) (bool, string) {
	if _, err := c.Write(msg); err != nil {
		return false, err.Error()
	}
	_ = c.CloseWrite()
	got, err := io.ReadAll(c)
	want := string(msg) + fmt.Sprintf("|eof after %d", len(msg))
	if err != nil || string(got) != want {
		return false, fmt.Sprintf("read %q, %v", got, err)
	}
	return true, ""
}

// readAll is what c carries until its end.
func readAll(c net.Conn) string {
	got, _ := io.ReadAll(c)
	return string(got)
}

// httpOn sends one request for path with Host host on c and reads its answer.
func httpOn(t *testing.T, c net.Conn, br *bufio.Reader, host string) (int, string, string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("answer to Host %s: %v", host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Compass-Egress"), string(body)
}

// transparentLines are the decision lines of type transparent.
func (th *transparentHarness) transparentLines() []map[string]any {
	var out []map[string]any
	for _, l := range logLines(th.logs.String(), "decision") {
		if l["type"] == typeTransparent {
			out = append(out, l)
		}
	}
	return out
}

// line waits for the n-th transparent decision line and returns it.
func (th *transparentHarness) line(t *testing.T, n int) map[string]any {
	t.Helper()
	waitFor(t, func() bool { return len(th.transparentLines()) >= n })
	return th.transparentLines()[n-1]
}

func ap(addr netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(addr, port) }
