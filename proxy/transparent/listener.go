// Package transparent is the sidecar's transparent listener. The agent's namespace
// sends every TCP connection, to any address and port, to the sidecar, whose nftables
// table redirects it here (net/nftredirect); the listener learns the connection's
// original destination (net/origdst), reads its first bytes until they show what it
// carries (a TLS ClientHello, an HTTP/1 request, or anything else) and hands it to a
// Handler, the proxy, which decides it and relays it to the original address alone.
package transparent

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-egress/compass-egress/net/origdst"
)

// Protocols a transparent connection is read as, as decision records name them.
const (
	TLS  = "tls"  // a TLS ClientHello
	HTTP = "http" // an HTTP/1 request line
	TCP  = "tcp"  // anything else, or nothing within the sniff wait
)

// Conn is one redirected connection, read up to what decides it. Only a ClientHello
// is read off the socket (Hello): an HTTP request and other bytes are looked at in
// place, and stay in the socket for whoever serves the connection.
type Conn struct {
	*net.TCPConn
	Source   netip.AddrPort // the client
	Dst      netip.AddrPort // its original destination
	Protocol string         // TLS, HTTP or TCP
	// ServerName and ECH are what a ClientHello asked for (ServerName "" for none);
	// HelloErr says it could not be read whole (malformed, too long, cut off, stalled).
	ServerName string
	ECH        bool
	HelloErr   error
	// Hello is the bytes of the ClientHello, to go upstream before any other.
	Hello []byte
}

// Handler serves the connections the listener has read. Either call owns the
// connection, and its listener slot (Config.Release), from then on.
type Handler interface {
	// ServeTransparent decides and serves c.
	ServeTransparent(c *Conn)
	// NotRedirected refuses c, which has no original destination other than the
	// listener itself (err says why): a client that dialled the listener directly.
	NotRedirected(c *net.TCPConn, source netip.AddrPort, err error)
}

// Config is a Listener's. Every field is required but Lookup and SniffWait.
type Config struct {
	Listener net.Listener
	// Lookup is the original destination of a connection (nil: origdst.Lookup; tests
	// fake it).
	Lookup func(*net.TCPConn) (netip.AddrPort, error)
	// SniffWait bounds the wait for a client's first bytes (0: DefaultSniffWait).
	SniffWait time.Duration
	// HelloTimeout bounds the reading of a ClientHello (--header-timeout).
	HelloTimeout time.Duration
	// Hold takes a connection slot before each accept; Release gives one back.
	Hold, Release func()
	Handler       Handler
	// AcceptFailed logs an accept failure other than the listener's close.
	AcceptFailed func(err error, retry time.Duration)
	// Recovered logs and counts a panic while a connection of client was read or
	// decided, which then closes (a panic must not end the sidecar).
	Recovered func(client string, p any)
}

// Listener accepts, reads and hands over redirected connections.
type Listener struct {
	cfg    Config
	ended  atomic.Bool // Serve returned
	closed atomic.Bool

	mu       sync.Mutex
	sniffing map[*net.TCPConn]struct{} // connections being read, which Close wakes
	wg       sync.WaitGroup            // every connection's goroutine
}

// DefaultSniffWait is how long a client's first bytes are waited for: a protocol whose
// server speaks first (SMTP, MySQL, FTP) sends nothing, and is decided as TCP once it
// has passed; a client that speaks first has sent its bytes well within it.
const DefaultSniffWait = 300 * time.Millisecond

// New makes a listener; Serve serves it.
func New(cfg Config) *Listener {
	if cfg.Lookup == nil {
		cfg.Lookup = origdst.Lookup
	}
	if cfg.SniffWait == 0 {
		cfg.SniffWait = DefaultSniffWait
	}
	return &Listener{cfg: cfg, sniffing: map[*net.TCPConn]struct{}{}}
}

// Addr is the listener's bound address.
func (l *Listener) Addr() net.Addr { return l.cfg.Listener.Addr() }

// Serving reports whether the listener takes connections (readiness): from New, since
// its socket is bound and the kernel queues what arrives before Serve accepts it, until
// Close or the end of Serve.
func (l *Listener) Serving() bool { return !l.closed.Load() && !l.ended.Load() }

// Accept failures other than a closed listener (descriptors ran out) pass when
// connections end: the listener waits and tries again, as the proxy's front does.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// Serve accepts until Close; each connection is read and handed over on a goroutine of
// its own.
func (l *Listener) Serve() error {
	defer l.ended.Store(true)
	var retry time.Duration
	for {
		l.cfg.Hold()
		c, err := l.cfg.Listener.Accept()
		if err != nil {
			l.cfg.Release()
			if errors.Is(err, net.ErrClosed) || l.closed.Load() {
				return err
			}
			retry = min(max(2*retry, acceptRetryMin), acceptRetryMax)
			l.cfg.AcceptFailed(err, retry)
			time.Sleep(retry)
			continue
		}
		retry = 0
		l.wg.Add(1)
		go l.serveConn(c.(*net.TCPConn))
	}
}

// Close stops accepting and wakes the connections being read, which then close
// unserved; connections already handed over are their handler's to end.
func (l *Listener) Close() error {
	l.closed.Store(true)
	err := l.cfg.Listener.Close()
	l.mu.Lock()
	for c := range l.sniffing {
		_ = c.SetReadDeadline(time.Now())
	}
	l.mu.Unlock()
	return err
}

// Wait returns once every connection's goroutine has returned (after Close; a
// handler's serving of a connection included).
func (l *Listener) Wait() { l.wg.Wait() }

func (l *Listener) serveConn(c *net.TCPConn) {
	defer l.wg.Done()
	defer func() {
		if p := recover(); p != nil {
			l.cfg.Recovered(c.RemoteAddr().String(), p)
			l.untrack(c)
			l.drop(c)
		}
	}()
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	dst, err := l.cfg.Lookup(c)
	if err == nil && isLocal(c, dst) {
		err = errOwnAddress
	}
	if err != nil {
		l.cfg.Handler.NotRedirected(c, src, err)
		return
	}
	tc := &Conn{TCPConn: c, Source: src, Dst: netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())}
	if !l.track(c) {
		l.drop(c)
		return
	}
	err = l.sniff(tc)
	l.untrack(c)
	if err != nil || l.closed.Load() {
		l.drop(c)
		return
	}
	l.cfg.Handler.ServeTransparent(tc)
}

// errOwnAddress is a connection whose original destination is the listener itself.
var errOwnAddress = errors.New("transparent: the original destination is the listener itself")

func isLocal(c *net.TCPConn, dst netip.AddrPort) bool {
	local, err := netip.ParseAddrPort(c.LocalAddr().String())
	return err == nil && local.Addr().Unmap() == dst.Addr().Unmap() && local.Port() == dst.Port()
}

func (l *Listener) drop(c *net.TCPConn) {
	c.Close()
	l.cfg.Release()
}

func (l *Listener) track(c *net.TCPConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed.Load() {
		return false
	}
	l.sniffing[c] = struct{}{}
	return true
}

func (l *Listener) untrack(c *net.TCPConn) {
	l.mu.Lock()
	delete(l.sniffing, c)
	l.mu.Unlock()
}
