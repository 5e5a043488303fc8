package connio

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// IdleClock is one relay's last sign of life, shared by its two directions. A direction
// learns how much it copied only when its copy returns (a splice reports nothing while
// it runs), so each direction's read deadline makes its copy return every half
// timeout: an active direction stamps the clock at least that often, and a direction
// whose deadline passes ends the relay only when neither direction has stamped it for
// a whole timeout. A relay is thus cut between one and one and a half timeouts after
// its last byte; a tunnel, whose watch may see a blocked write's progress half a
// timeout late (IdleWatch), up to two.
type IdleClock struct {
	timeout time.Duration
	last    atomic.Int64 // monoNanos of the last progress seen
	// socks, when set, are the relay's sockets, whose kernel counts of bytes moved
	// the relay's IdleWatch reads (seen: their sum at its last look). A copy blocked
	// in a write (a spliced chunk of up to 1 MiB) stamps the clock only when it
	// returns, however steadily its peer reads meanwhile; the counts show that
	// progress.
	socks [2]*net.TCPConn
	seen  uint64
}

func NewIdleClock(timeout time.Duration) *IdleClock {
	c := &IdleClock{timeout: timeout}
	c.touch()
	return c
}

func (c *IdleClock) touch() { c.last.Store(monoNanos()) }

// WatchSockets makes the kernel counts of bytes a and b moved, the relay's two
// sockets, progress the clock's IdleWatch reads (see socks).
func (c *IdleClock) WatchSockets(a, b *net.TCPConn) { c.socks = [2]*net.TCPConn{a, b} }

// arm sets src's read deadline for the next period.
func (c *IdleClock) arm(src net.Conn) { _ = src.SetReadDeadline(time.Now().Add(c.timeout / 2)) }

// idle reports whether no direction made progress for the timeout.
func (c *IdleClock) idle() bool { return sinceMono(c.last.Load()) >= c.timeout }

// monoStart anchors monoNanos. The idle marks are int64 nanoseconds, one atomic word
// each; read off the wall clock they would move with a step of it (NTP, a resumed
// virtual machine): a step forward could cut live relays and requests as idle, a
// step back would let idle ones live on. time.Since of a time.Time that carries the
// monotonic clock, as time.Now's does, is not moved by a step.
var monoStart = time.Now()

// monoNanos is the monotonic clock in nanoseconds since monoStart; never 0, which marks
// "no wait in progress" (idleTimer).
func monoNanos() int64 { return int64(time.Since(monoStart)) + 1 }

// sinceMono is how long ago the monoNanos mark m was taken.
func sinceMono(m int64) time.Duration { return time.Duration(monoNanos() - m) }

// IdleWatch calls end(nil) once its clock has seen no progress for its timeout,
// checking at most a timeout after the last progress, and every half timeout when the
// clock has sockets, whose kernel counts it then reads as progress when they changed.
// Its timer runs the checks on goroutines of their own: a panic in one calls end with
// the value recovered, for the owner to report and end the relay. A tunnel holds one
// by value: a tunnel's memory is most of what an idle tunnel costs.
//
// The same timer turns on a tunnel's upstream keep-alive (UpstreamKeepAlive) once the
// tunnel has lived a while (see Start): a second timer per tunnel cost about 200 bytes
// of every idle tunnel (docs/bench.md).
type IdleWatch struct {
	clock   *IdleClock
	end     func(panicked any)
	every   time.Duration
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	// keepAlive is the socket that gets UpstreamKeepAlive at keepAliveAt (monoNanos: a
	// time.Time would take the tunnel to the next size class).
	keepAlive   *net.TCPConn
	keepAliveAt int64
}

// WatchIdle starts a watch of clock; the function it returns stops it, for a relay
// that ended first.
func WatchIdle(clock *IdleClock, end func(panicked any)) (stop func()) {
	w := new(IdleWatch)
	w.Start(clock, nil, 0, end)
	return w.Stop
}

// Start starts the watch of clock, which calls end. keepAlive, when not nil, is a
// tunnel's upstream socket, which gets UpstreamKeepAlive once the tunnel has lived
// keepAliveAfter.
func (w *IdleWatch) Start(clock *IdleClock, keepAlive *net.TCPConn, keepAliveAfter time.Duration, end func(panicked any)) {
	w.clock, w.end, w.every = clock, end, clock.timeout
	w.keepAlive = keepAlive
	if clock.socks[0] != nil {
		w.every /= 2
	}
	first := w.every
	if w.keepAlive != nil {
		w.keepAliveAt = monoNanos() + int64(keepAliveAfter)
		first = min(first, keepAliveAfter)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = time.AfterFunc(first, w.check)
}

func (w *IdleWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Nothing else recovers the timer's goroutine (see IdleWatch).
	defer func() {
		if p := recover(); p != nil {
			w.stopped = true
			w.end(p)
		}
	}()
	if w.stopped {
		return
	}
	c := w.clock
	if c.socks[0] != nil {
		// The first look always sees a change (the counts start at 0 here, which saves
		// two system calls per tunnel set-up): an idle tunnel is then cut a half
		// timeout late, within the clock's bound.
		if n := tcpMoved(c.socks[0]) + tcpMoved(c.socks[1]); n != c.seen {
			c.seen = n
			c.touch()
		}
	}
	left := c.timeout - sinceMono(c.last.Load())
	if left <= 0 {
		w.end(nil)
		return
	}
	next := min(left, w.every)
	if w.keepAlive != nil {
		if wait := -sinceMono(w.keepAliveAt); wait > 0 {
			next = min(next, wait)
		} else {
			_ = w.keepAlive.SetKeepAliveConfig(UpstreamKeepAlive)
			w.keepAlive = nil
		}
	}
	w.t.Reset(next)
}

// Stop stops the watch, for a relay that ended first.
func (w *IdleWatch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
}

// Stopped reports whether Stop was called, which released the watch's timer.
func (w *IdleWatch) Stopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// tcpMoved is what the kernel counts of the bytes c moved: received, and sent and
// acknowledged (which a peer that reads nothing does not do); 0 once c is closed.
func tcpMoved(c *net.TCPConn) uint64 {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var n uint64
	_ = rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = info.Bytes_acked + info.Bytes_received
		}
	})
	return n
}

// IdleConn is the client side of a relay that is not spliced (a websocket): every read
// and write is a sign of life, counted in up (read) and down (written), and a read
// fails with the deadline's error once the relay has been idle for the clock's
// timeout.
type IdleConn struct {
	net.Conn
	clock    *IdleClock
	up, down *atomic.Int64
	client   Request // the websocket request's, which a panic in a copy cuts
	// inFlight is held (shared) across each read and write with its count, so that
	// quiesce can wait for the last one.
	inFlight sync.RWMutex
}

// NewIdleConn is c, the client side of a relay that clock watches, counting what it
// reads in up and what it writes in down; a panic in a read or write cuts req.
func NewIdleConn(c net.Conn, clock *IdleClock, up, down *atomic.Int64, req Request) *IdleConn {
	return &IdleConn{Conn: c, clock: clock, up: up, down: down, client: req}
}

func (c *IdleConn) Read(p []byte) (n int, err error) {
	c.inFlight.RLock()
	defer c.endIO(&n, &err)
	for {
		c.clock.arm(c.Conn)
		n, err := c.Conn.Read(p)
		if n > 0 {
			c.up.Add(int64(n))
			c.clock.touch()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = nil
			}
			return n, err
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || c.clock.idle() {
			return n, err
		}
	}
}

func (c *IdleConn) Write(p []byte) (n int, err error) {
	c.inFlight.RLock()
	defer c.endIO(&n, &err)
	n, err = c.Conn.Write(p)
	if n > 0 {
		c.down.Add(int64(n))
		c.clock.touch()
	}
	return n, err
}

// endIO ends a read or write. goproxy's copies of a websocket relay call them on
// goroutines of their own, which the proxy cannot recover at their top: a panic in one
// (the client's connection is the relay's one side the proxy's code serves) cuts the
// request and fails the call, which ends that copy, instead of ending the process.
func (c *IdleConn) endIO(n *int, err *error) {
	if p := recover(); p != nil {
		*n, *err = 0, errRelayPanicked
		c.client.Recovered(p)
	}
	c.inFlight.RUnlock()
}

// errRelayPanicked fails a websocket relay's read or write that panicked.
var errRelayPanicked = errors.New("proxy: the relay panicked")

// Quiesce waits for the read and write in progress, if any, to return and be
// counted. Call it after closing the connection: later ones move no byte.
func (c *IdleConn) Quiesce() {
	c.inFlight.Lock()
	//lint:ignore SA2001 taking the lock is the wait for the reads and writes holding it
	c.inFlight.Unlock()
}

// Errors that end an HTTP request or answer which moved no byte for the tunnel idle
// timeout. The proxy's logs and metrics tell them apart.
var (
	ErrClientIdle       = errors.New("proxy: the client read nothing of the answer for the tunnel idle timeout")
	ErrUpstreamIdle     = errors.New("proxy: the upstream sent nothing of the answer body for the tunnel idle timeout")
	ErrUpstreamHeadIdle = errors.New("proxy: the upstream sent nothing of the answer head for the tunnel idle timeout")
	ErrClientBodyIdle   = errors.New("proxy: the client sent nothing of the request body for the tunnel idle timeout")
	ErrUpstreamBodyIdle = errors.New("proxy: the upstream took nothing of the request for the tunnel idle timeout")
)

// IdleDeadline is the read or the write deadline of a connection whose reads or writes
// fail once they have made no progress for the timeout, while one that keeps moving
// bytes, however slowly, is not cut (IdleWriter, upclient's headLimit, clientReader). The
// deadline is set a timeout ahead and moved only once more than half of it is used, so
// a connection that keeps moving bytes moves it at most once per half timeout, not once
// per call; a deadline that passes less than a timeout after the last progress (one an
// earlier call left) is moved on, not obeyed.
type IdleDeadline struct {
	conn    net.Conn
	write   bool // the write deadline; else the read deadline
	timeout time.Duration
	at      time.Time // the deadline set on conn; zero: none
}

// NewIdleDeadline is the write deadline (write) or the read deadline of conn, for
// calls that may make no progress for timeout.
func NewIdleDeadline(conn net.Conn, write bool, timeout time.Duration) IdleDeadline {
	return IdleDeadline{conn: conn, write: write, timeout: timeout}
}

// Timeout is the deadline's timeout; 0 for the zero IdleDeadline, which bounds nothing.
func (d *IdleDeadline) Timeout() time.Duration { return d.timeout }

// Due reports whether a call starting at now must first move the deadline (Begin).
func (d *IdleDeadline) Due(now time.Time) bool { return d.at.Sub(now) < d.timeout/2 }

// Begin readies the deadline for a call starting at now.
func (d *IdleDeadline) Begin(now time.Time) {
	if d.Due(now) {
		d.Set(now.Add(d.timeout))
	}
}

// Passed is for a call whose deadline passed, with its last progress at last: it
// reports whether the call has now waited for the whole timeout and, if not, moves the
// deadline a timeout past last.
func (d *IdleDeadline) Passed(last time.Time) (idle bool) {
	if time.Since(last) >= d.timeout {
		return true
	}
	d.Set(last.Add(d.timeout))
	return false
}

// Set sets the deadline to t; the zero time removes it.
func (d *IdleDeadline) Set(t time.Time) {
	d.at = t
	if d.write {
		_ = d.conn.SetWriteDeadline(t)
	} else {
		_ = d.conn.SetReadDeadline(t)
	}
}

// IdleWriter is a connection whose writes fail with stalled once the peer has read
// nothing for the timeout. On a client connection (ErrClientIdle): an answer it stopped
// reading must not hold the request's goroutine, connection slot and upstream
// connection. On net/http's Transport's upstream connections (ErrUpstreamBodyIdle):
// neither must a request body the upstream stopped taking, which no other bound covers,
// since the Transport starts its wait for the answer head only once the body is
// written.
type IdleWriter struct {
	net.Conn
	stalled  error // what a write that made no progress for the timeout fails with
	deadline IdleDeadline
}

func NewIdleWriter(c net.Conn, timeout time.Duration, stalled error) IdleWriter {
	return IdleWriter{Conn: c, stalled: stalled, deadline: IdleDeadline{conn: c, write: true, timeout: timeout}}
}

func (w *IdleWriter) Write(p []byte) (int, error) {
	last := time.Now() // the last progress: the write's start, then each partial write
	w.deadline.Begin(last)
	written := 0
	for {
		n, err := w.Conn.Write(p[written:])
		written += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return written, err
		}
		if n > 0 {
			last = time.Now()
		}
		if w.deadline.Passed(last) {
			return written, w.stalled
		}
	}
}

// HandOver returns the connection, without the deadline, to a tunnel or relay that
// bounds its writes its own way.
func (w *IdleWriter) HandOver() net.Conn {
	if !w.deadline.at.IsZero() {
		w.deadline.Set(time.Time{})
	}
	return w.Conn
}

// idleTimer is the one timer per request of ReadWatch and HeadWatch. Started once, it
// is moved only when it expires: then it ends the request (cancels it) if the moment in
// mark is a whole timeout old, and otherwise waits for what is left; a mark of 0 (no
// wait in progress) waits a whole timeout again.
type idleTimer struct {
	timeout time.Duration
	mark    atomic.Int64 // monoNanos
	fired   atomic.Bool  // the timer ended the request
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

// startLocked starts the timer of cl's request, unless it runs or was stopped. w.mu is
// held.
func (w *idleTimer) startLocked(cl Request) {
	if w.t == nil && !w.stopped {
		w.t = time.AfterFunc(w.timeout, func() { w.check(cl) })
	}
}

func (w *idleTimer) check(cl Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// The timer runs check on a goroutine of its own, which nothing else recovers: a
	// panic cuts the request, not the process.
	defer func() {
		if p := recover(); p != nil {
			w.stopped = true
			cl.Recovered(p)
		}
	}()
	if w.stopped {
		return
	}
	left := w.timeout
	if m := w.mark.Load(); m != 0 {
		left -= sinceMono(m)
	}
	if left > 0 {
		w.t.Reset(left)
		return
	}
	w.stopped = true
	w.fired.Store(true)
	cl.Cancel()
}

// SetTimeout sets the timeout, before the watch's first use; 0: no watch.
func (w *idleTimer) SetTimeout(d time.Duration) { w.timeout = d }

// Timeout is the timeout SetTimeout set.
func (w *idleTimer) Timeout() time.Duration { return w.timeout }

// Fired reports whether the timer ended the request.
func (w *idleTimer) Fired() bool { return w.fired.Load() }

// stopLocked stops the timer for good. w.mu is held.
func (w *idleTimer) stopLocked() {
	w.stopped = true
	if w.t != nil {
		w.t.Stop()
	}
}

// ReadWatch bounds the reads of an answer body whose connection the proxy cannot give a
// deadline (net/http's Transport reads it and pools it): its timer looks at the read in
// progress (mark: when it began; 0 between reads), and once that read has waited for
// the timeout it cancels the request (the Transport then closes the connection); the
// read fails with ErrUpstreamIdle. The timer starts with the first read.
type ReadWatch struct {
	idleTimer // timeout 0: no watch
}

// Read reads r into p for the request cl, whose first read starts the watch.
func (w *ReadWatch) Read(r io.Reader, p []byte, cl Request) (int, error) {
	w.mark.Store(monoNanos())
	if w.t == nil { // only this goroutine sets it
		w.mu.Lock()
		w.startLocked(cl)
		w.mu.Unlock()
	}
	n, err := r.Read(p)
	w.mark.Store(0)
	if err != nil && w.fired.Load() {
		err = ErrUpstreamIdle
	}
	return n, err
}

// Stop ends the watch.
func (w *ReadWatch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopLocked()
}

// HeadWatch bounds the wait for an answer head on net/http's Transport as upclient's
// headLimit does on the upstream client's connections: the wait starts once the request is
// written (its body included) and ends the request (cancels it; the Transport then
// closes the connection) when the upstream sends no byte for the timeout; every byte
// read meanwhile, interim 1xx answers included, is progress. The Transport's own
// ResponseHeaderTimeout would be one timer for the whole head, which interim answers
// do not restart. Its timer's mark is the last progress, 0 until the request is
// written; fired tells an idle head's end from a swap's or the drain's.
type HeadWatch struct {
	idleTimer
	conn *UpstreamConn // whose reads are the wait's progress
	// OnConnEnd, when set, stops the reads of the request's body (see ended).
	OnConnEnd func()
}

// GotConn makes c's reads the wait's progress. c is the connection the Transport gave
// the request (a *tls.Conn over ours for https:// URIs); a retry on another
// connection starts the wait again once it is written.
func (w *HeadWatch) GotConn(c net.Conn) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	uc, _ := c.(*UpstreamConn)
	w.mark.Store(0)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.release()
	if uc != nil && !w.stopped {
		w.conn = uc
		uc.head.Store(w)
	}
}

// Wrote starts the wait of cl's request: the request, body included, is written.
func (w *HeadWatch) Wrote(cl Request) {
	w.mark.Store(monoNanos())
	w.mu.Lock()
	defer w.mu.Unlock()
	w.startLocked(cl)
}

// progress records a read of the head; bytes read before the request is written (an
// early answer, a 100 Continue) do not start the wait.
func (w *HeadWatch) progress() {
	if w.mark.Load() != 0 {
		w.mark.Store(monoNanos())
	}
}

// Stop ends the watch once the round trip returned.
func (w *HeadWatch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopLocked()
	w.release()
}

// ended records that the Transport closed the connection while the request waits on
// it: the upstream is gone (or the request was cut). The Transport returns its error
// only once its writer of the request body returns, and that writer may wait in a read
// of a client still sending the body, for as long as the client takes: the body's
// reads are stopped, so the client gets its answer now.
func (w *HeadWatch) ended() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped && w.OnConnEnd != nil {
		w.OnConnEnd()
	}
}

func (w *HeadWatch) release() {
	if w.conn != nil {
		w.conn.head.CompareAndSwap(w, nil)
		w.conn = nil
	}
}

// UpstreamConn is a connection of net/http's Transport: its writes are bounded as an
// IdleWriter's, its reads are the progress of the request waiting for its answer head
// on it, if any, and its Close that request's upstream gone (see HeadWatch).
type UpstreamConn struct {
	IdleWriter
	head atomic.Pointer[HeadWatch]
}

// NewUpstreamConn is c, whose writes fail with ErrUpstreamBodyIdle once they made no
// progress for timeout.
func NewUpstreamConn(c net.Conn, timeout time.Duration) *UpstreamConn {
	return &UpstreamConn{IdleWriter: NewIdleWriter(c, timeout, ErrUpstreamBodyIdle)}
}

func (c *UpstreamConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if w := c.head.Load(); w != nil {
			w.progress()
		}
	}
	return n, err
}

// Close is the Transport giving the connection up: its reader met the connection's end
// (for https://, TLS's close_notify, which ends the reads without one failing here) or
// an error, or the request was cancelled.
func (c *UpstreamConn) Close() error {
	if w := c.head.Load(); w != nil {
		w.ended()
	}
	return c.Conn.Close()
}
