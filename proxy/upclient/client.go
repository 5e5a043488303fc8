// Package upclient is the sidecar's own client for the forwarded HTTP requests it can
// write and answer on the handler's goroutine, with a pool of upstream connections per
// rule set. The proxy dials through a Dialer, which checks each address against the
// policy, and re-checks every connection, pooled or new, before a request is written.
package upclient

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// Client forwards the requests that can be written and answered on the
// handler's own goroutine: plain http, no body (nothing to write while the answer
// arrives), no Upgrade, and a method that may be sent twice (a pooled connection the
// upstream closed meanwhile is retried once on a new one). net/http's Transport, which
// hands every request to two goroutines of its own and back, carries the others. Each
// rule set has its own client, so a connection opened under one policy never carries
// a request decided under another.
type Client struct {
	cfg   Config
	mu    sync.Mutex
	idle  map[netip.AddrPort][]*upConn
	nidle int // connections in idle, across upstreams
}

// Dialer opens the upstream connections the pool has none of.
type Dialer interface {
	// DialUpstream connects to one of t's addresses for the request whose context is
	// ctx, and returns the connection and the address it reached.
	DialUpstream(ctx context.Context, t Target) (*net.TCPConn, netip.Addr, error)
}

// Target is where one request may go: the name it was decided on, the addresses the
// decision checked, and the port.
type Target struct {
	Host  string
	Addrs []netip.Addr
	Port  uint16
}

// Config is a Client's dialer and timeouts.
type Config struct {
	Dialer Dialer
	// IdleTimeout closes a pooled connection that carried no request for that long.
	IdleTimeout time.Duration
	// ReadIdleTimeout ends a request whose upstream sent no byte of its answer for
	// that long (connio.ErrUpstreamHeadIdle, connio.ErrUpstreamIdle).
	ReadIdleTimeout time.Duration
}

// upConn is one upstream connection and its reader, which outlives each answer.
type upConn struct {
	c     *net.TCPConn
	br    *bufio.Reader
	limit headLimit // br's source
	key   netip.AddrPort
	timer *time.Timer // closes it once idle for the idle timeout
}

func newUpConn(c *net.TCPConn, key netip.AddrPort, idle time.Duration) *upConn {
	uc := &upConn{c: c, key: key, limit: headLimit{c: c, left: -1, deadline: connio.NewIdleDeadline(c, false, idle)}}
	uc.br = bufio.NewReaderSize(&uc.limit, 4096)
	return uc
}

// headLimit reads the connection with a budget while an answer head is read (left >=
// 0), and without one for the body (left < 0). A read that waits for the idle timeout
// fails, with connio.ErrUpstreamHeadIdle while a head is read (the first head read starts
// once the request is written) and connio.ErrUpstreamIdle for the body: an upstream that
// never answers, or goes silent in the middle of an answer, must not hold the request
// for ever, and one that keeps sending, however slowly, is not cut (see connio.IdleDeadline).
type headLimit struct {
	c        net.Conn
	left     int64
	deadline connio.IdleDeadline
}

func (l *headLimit) Read(p []byte) (int, error) {
	if l.left < 0 {
		return l.readIdle(p, connio.ErrUpstreamIdle)
	}
	if l.left == 0 {
		return 0, ErrAnswerHeadTooLong
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.readIdle(p, connio.ErrUpstreamHeadIdle)
	l.left -= int64(n)
	return n, err
}

// readIdle reads p, failing with idleErr once the read has waited for the idle timeout.
func (l *headLimit) readIdle(p []byte, idleErr error) (int, error) {
	start := time.Now()
	l.deadline.Begin(start)
	for {
		n, err := l.c.Read(p)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if l.deadline.Passed(start) {
			return 0, idleErr
		}
	}
}

// quiet reports whether a pooled connection has nothing to read. An upstream may
// answer on an idle connection before it closes it (a 408): that answer must not be
// taken for the next request's.
func (uc *upConn) quiet() bool {
	rc, err := uc.c.SyscallConn()
	if err != nil {
		return false
	}
	var errno unix.Errno
	if err := rc.Control(func(fd uintptr) {
		// A raw recv: unix.Recvfrom would allocate the sender's address it returns.
		var b [1]byte
		_, _, errno = unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	}); err != nil {
		return false
	}
	return errno == unix.EAGAIN
}

// The idle connections kept: per upstream address and in all, the Transport's
// MaxIdleConnsPerHost and MaxIdleConns (each holds a descriptor until it idles out).
const (
	MaxIdlePerUpstream = 64
	MaxIdle            = 1024
)

// An upstream's answer heads, its interim (1xx) answers included, may take at most
// MaxAnswerHeadBytes and MaxInterimAnswers, and the final head httpfront.MaxHeadFields fields: an
// upstream that sends an endless head must not grow the proxy's memory. The bytes are
// a request head's bound, not net/http's 10 MiB, which an upstream filled with tiny
// fields held about 280 MiB of heap per answer until its body began.
const (
	MaxAnswerHeadBytes = 64 << 10
	MaxInterimAnswers  = 5
)

var (
	ErrAnswerHeadTooLong     = errors.New("proxy: upstream answer head too long")
	ErrTooManyInterimAnswers = errors.New("proxy: too many interim answers from the upstream")
)

var upWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}

// New is a client with an empty pool.
func New(cfg Config) *Client {
	return &Client{cfg: cfg, idle: make(map[netip.AddrPort][]*upConn)}
}

// Handles reports whether req is one the client carries.
func Handles(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody || req.URL.Scheme != "http" || req.Header.Get("Upgrade") != "" {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// ErrRecheckFailed: a swap came between the decision and the connection, and the new
// policy does not allow the connection's address.
var ErrRecheckFailed = errors.New("proxy: the upstream address is no longer allowed")

// RoundTrip sends req to one of t's addresses and returns the answer; its body gives
// the connection back to the pool when read to its end. allowed records the
// connection's address and re-checks it before the request is written (a swap may
// have come since the decision); a connection it refuses is closed, and the error is
// ErrRecheckFailed.
func (u *Client) RoundTrip(req *http.Request, t Target, allowed func(net.Conn) bool) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		uc, reused, err := u.conn(req.Context(), t)
		if err != nil {
			return nil, err
		}
		if !allowed(uc.c) {
			uc.c.Close()
			return nil, ErrRecheckFailed
		}
		resp, err := u.exchange(req, uc)
		if err == nil {
			return resp, nil
		}
		uc.c.Close()
		// A pooled connection may have been closed by the upstream while idle: the
		// request is sent again once, on a new connection. One that got no answer
		// for the idle timeout is not: that would double the bound.
		if !reused || attempt > 0 || req.Context().Err() != nil || errors.Is(err, connio.ErrUpstreamHeadIdle) {
			return nil, err
		}
	}
}

// conn takes a quiet idle connection to one of t's addresses, or dials one.
func (u *Client) conn(ctx context.Context, t Target) (*upConn, bool, error) {
	for {
		uc := u.takeIdle(t)
		if uc == nil {
			break
		}
		if uc.quiet() {
			return uc, true, nil
		}
		uc.c.Close()
	}
	c, addr, err := u.cfg.Dialer.DialUpstream(ctx, t)
	if err != nil {
		return nil, false, err
	}
	return newUpConn(c, netip.AddrPortFrom(addr, t.Port), u.cfg.ReadIdleTimeout), false, nil
}

// takeIdle removes and returns an idle connection to one of t's addresses, or nil.
func (u *Client) takeIdle(t Target) *upConn {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, a := range t.Addrs {
		key := netip.AddrPortFrom(a, t.Port)
		list := u.idle[key]
		for len(list) > 0 {
			uc := list[len(list)-1]
			list = list[:len(list)-1]
			u.nidle--
			if uc.timer.Stop() { // else it is being closed for idling
				u.setIdle(key, list)
				return uc
			}
		}
		u.setIdle(key, list)
	}
	return nil
}

func (u *Client) setIdle(key netip.AddrPort, list []*upConn) {
	if len(list) == 0 {
		delete(u.idle, key)
		return
	}
	u.idle[key] = list
}

// exchange writes req and reads its answer, skipping interim (1xx) answers. The
// request's cancellation (a swap that cuts it, the drain's deadline) closes the
// connection, which ends a write or read in progress.
func (u *Client) exchange(req *http.Request, uc *upConn) (*http.Response, error) {
	stop := context.AfterFunc(req.Context(), func() { uc.c.Close() })
	bw := upWriters.Get().(*bufio.Writer)
	bw.Reset(uc.c)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	upWriters.Put(bw)
	var resp *http.Response
	uc.limit.left = MaxAnswerHeadBytes
	for interim := 0; err == nil; interim++ {
		if interim > MaxInterimAnswers {
			err = ErrTooManyInterimAnswers
			break
		}
		resp, err = http.ReadResponse(uc.br, req)
		if err == nil && (resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols) {
			break
		}
	}
	uc.limit.left = -1
	if err != nil {
		stop()
		return nil, err
	}
	reuse := !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols
	resp.Body = &upBody{body: resp.Body, u: u, uc: uc, stop: stop, reuse: reuse}
	return resp, nil
}

// put keeps a connection whose answer was read to its end for the next request.
func (u *Client) put(uc *upConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.idle[uc.key]) >= MaxIdlePerUpstream || u.nidle >= MaxIdle || uc.br.Buffered() > 0 {
		uc.c.Close() // a full pool, or bytes beyond the answer: the connection is out of step
		return
	}
	if uc.timer == nil {
		uc.timer = time.AfterFunc(u.cfg.IdleTimeout, func() { u.expire(uc) })
	} else {
		uc.timer.Reset(u.cfg.IdleTimeout)
	}
	u.idle[uc.key] = append(u.idle[uc.key], uc)
	u.nidle++
}

// expire closes a connection that stayed idle for the idle timeout.
func (u *Client) expire(uc *upConn) {
	u.mu.Lock()
	list := u.idle[uc.key]
	for i, x := range list {
		if x == uc {
			u.setIdle(uc.key, append(list[:i:i], list[i+1:]...))
			u.nidle--
			break
		}
	}
	u.mu.Unlock()
	uc.c.Close()
}

// IdleConns is the number of idle connections the pool holds.
func (u *Client) IdleConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.nidle
}

// CloseIdle closes every idle connection (the rule set was replaced, or the proxy
// stops); connections in use close when their answer ends.
func (u *Client) CloseIdle() {
	u.mu.Lock()
	idle := u.idle
	u.idle = make(map[netip.AddrPort][]*upConn)
	u.nidle = 0
	u.mu.Unlock()
	for _, list := range idle {
		for _, uc := range list {
			uc.timer.Stop()
			uc.c.Close()
		}
	}
}

// upBody is an answer's body: read to its end, it gives the connection back to the
// pool; closed before that, it closes the connection (draining an unknown rest could
// take forever).
type upBody struct {
	body  io.ReadCloser
	u     *Client
	uc    *upConn
	stop  func() bool // ends the cancellation watch; false if it already closed uc
	reuse bool
	done  bool
}

func (b *upBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if errors.Is(err, io.EOF) {
		b.finish(true)
	}
	return n, err
}

func (b *upBody) Close() error {
	b.finish(false)
	return nil
}

func (b *upBody) finish(eof bool) {
	if b.done {
		return
	}
	b.done = true
	if watching := b.stop(); watching && eof && b.reuse {
		b.u.put(b.uc)
		return
	}
	b.uc.c.Close()
}
