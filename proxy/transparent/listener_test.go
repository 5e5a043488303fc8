package transparent

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handed is what a fake Handler was given.
type handed struct {
	conn          *Conn
	notRedirected error
}

type fakeHandler struct {
	got    chan handed
	panics bool
}

func (h fakeHandler) ServeTransparent(c *Conn) {
	if h.panics {
		panic("test: handler panics")
	}
	c.Close()
	h.got <- handed{conn: c}
}
func (h fakeHandler) NotRedirected(c *net.TCPConn, _ netip.AddrPort, err error) {
	c.Close()
	h.got <- handed{notRedirected: err}
}

// newTestListener serves a listener on loopback whose original destination is dst for
// every connection (zero: not redirected; the listener's own address: a loop).
func newTestListener(t *testing.T, dst func(l net.Addr) netip.AddrPort, wait time.Duration, tune ...func(*Config)) (*Listener, fakeHandler, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := fakeHandler{got: make(chan handed, 4)}
	var held atomic.Int32
	cfg := Config{
		Listener: ln, SniffWait: wait, HelloTimeout: time.Second, Handler: h,
		Lookup: func(*net.TCPConn) (netip.AddrPort, error) {
			if d := dst(ln.Addr()); d.IsValid() {
				return d, nil
			}
			return netip.AddrPort{}, errors.New("not redirected")
		},
		Hold: func() { held.Add(1) }, Release: func() { held.Add(-1) },
		AcceptFailed: func(err error, _ time.Duration) { t.Errorf("accept: %v", err) },
		Recovered:    func(_ string, p any) { t.Errorf("panic: %v", p) },
	}
	for _, f := range tune {
		f(&cfg)
	}
	if fh, ok := cfg.Handler.(fakeHandler); ok {
		h = fh
	}
	l := New(cfg)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = l.Serve() }()
	t.Cleanup(func() { l.Close(); wg.Wait(); l.Wait() })
	return l, h, &held
}

func TestListenerReadsWhatDecides(t *testing.T) {
	orig := netip.MustParseAddrPort("192.0.2.1:443")
	hello := hellotest.ClientHello(t, "a.test")
	for _, tc := range []struct {
		name   string
		writes []string
		proto  string
		sni    string
	}{
		{"tls", []string{string(hello)}, TLS, "a.test"},
		{"tls in pieces", []string{string(hello[:3]), string(hello[3:40]), string(hello[40:])}, TLS, "a.test"},
		{"http", []string{"GET / HTTP/1.1\r\n"}, HTTP, ""},
		{"http method in pieces", []string{"PO", "ST / HTTP/1.1\r\n"}, HTTP, ""},
		{"ssh", []string{"SSH-2.0-x\r\n"}, TCP, ""},
		{"nothing", nil, TCP, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, h, _ := newTestListener(t, func(net.Addr) netip.AddrPort { return orig }, 100*time.Millisecond)
			c := dialListener(t, l, tc.writes)
			got := <-h.got
			c.Close()
			if got.conn == nil || got.conn.Protocol != tc.proto || got.conn.ServerName != tc.sni || got.conn.Dst != orig || got.conn.HelloErr != nil {
				t.Fatalf("handed %+v", got)
			}
			if tc.proto == TLS && string(got.conn.Hello) != string(hello) {
				t.Fatalf("hello: %d bytes, want %d", len(got.conn.Hello), len(hello))
			}
		})
	}
}

// dialListener connects to l and sends writes, apart.
func dialListener(t *testing.T, l *Listener, writes []string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range writes {
		if _, err := io.WriteString(c, w); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // apart, in segments of their own
	}
	return c
}

func TestListenerRefusesWhatWasNotRedirected(t *testing.T) {
	for name, dst := range map[string]func(net.Addr) netip.AddrPort{
		"no original destination": func(net.Addr) netip.AddrPort { return netip.AddrPort{} },
		"the listener itself":     func(a net.Addr) netip.AddrPort { return netip.MustParseAddrPort(a.String()) },
	} {
		t.Run(name, func(t *testing.T) {
			l, h, _ := newTestListener(t, dst, time.Second)
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := <-h.got; got.notRedirected == nil {
				t.Fatalf("handed %+v, want not redirected", got)
			}
		})
	}
}

// Close wakes the connections being read: they close unserved, slots given back.
func TestListenerCloseWakesSniffing(t *testing.T) {
	l, h, held := newTestListener(t, func(net.Addr) netip.AddrPort { return netip.MustParseAddrPort("192.0.2.1:22") }, time.Hour)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for l.sniffingCount() == 0 {
		time.Sleep(time.Millisecond)
	}
	l.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("read: %v", err)
	}
	l.Wait()
	select {
	case got := <-h.got:
		t.Fatalf("handed %+v after Close", got)
	default:
	}
	if n := held.Load(); n != 0 {
		t.Fatalf("%d slots held after Close", n)
	}
}

func (l *Listener) sniffingCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sniffing)
}

// A handler's panic ends its connection alone: recovered, counted, the connection
// closed and its slot given back; the listener goes on serving.
func TestListenerRecoversAPanic(t *testing.T) {
	var recovered atomic.Int32
	l, _, held := newTestListener(t, func(net.Addr) netip.AddrPort { return netip.MustParseAddrPort("192.0.2.1:22") }, 10*time.Millisecond,
		func(c *Config) {
			c.Handler = fakeHandler{got: make(chan handed, 1), panics: true}
			c.Recovered = func(string, any) { recovered.Add(1) }
		})
	for i := range 2 {
		c := dialListener(t, l, []string{"x"})
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		// Closed with the client's byte unread: a reset, or an end.
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connection %d: %v", i, err)
		}
		c.Close()
	}
	for held.Load() != 1 { // the accept loop's own slot
		time.Sleep(time.Millisecond)
	}
	if n := recovered.Load(); n != 2 {
		t.Fatalf("recovered %d panics, want 2", n)
	}
}
