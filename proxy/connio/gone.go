package connio

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// GoneWatch notices a client that leaves while its request waits for the upstream's
// answer, or while the answer streams. A model call can take minutes before its answer
// head, and nothing else reads the client's connection meanwhile: without the watch the
// upstream would work on for a client long gone, until the answer came or idled out.
// The watch reads one byte. An end or an error of the connection (a close, a reset, a
// half-close, which squid's default and net/http's server also take for a client that
// left) cancels the request; a byte (the start of a pipelined request) is kept for the
// next head and ends the watch. Each client connection has one, armed per request.
type GoneWatch struct {
	timer *time.Timer
	conn  net.Conn       // the request's client connection, while armed
	req   Request        // the request, while armed
	left  *atomic.Bool   // the request's clientLeft, while armed
	wg    sync.WaitGroup // the armed watch, until it is stopped or its read returns

	mu      sync.Mutex
	stopped bool // stop has begun: a read not yet started must not start

	b   [1]byte
	got bool // b holds a byte the client sent
}

// Arm starts the watch of req, whose client is conn, after delay; Stop must follow. A
// client that leaves sets left, then cancels req.
func (w *GoneWatch) Arm(conn net.Conn, req Request, delay time.Duration, left *atomic.Bool) {
	w.conn, w.req, w.left, w.stopped, w.got = conn, req, left, false, false
	w.wg.Add(1)
	if w.timer == nil {
		w.timer = time.AfterFunc(delay, w.watch)
	} else {
		w.timer.Reset(delay)
	}
}

func (w *GoneWatch) watch() {
	defer w.wg.Done()
	// The timer runs the watch on a goroutine of its own, which nothing else recovers:
	// a panic cuts the request and its connection, not the process. Before wg.Done,
	// which lets stop forget the request.
	defer func() {
		if p := recover(); p != nil {
			w.req.Recovered(p)
		}
	}()
	if !w.begin() {
		return
	}
	n, err := w.conn.Read(w.b[:])
	switch {
	case n == 1:
		w.got = true
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
		// stopped, the drain's wake-up, or the proxy's own close (a swap's cut)
	default:
		w.left.Store(true)
		w.req.Cancel()
	}
}

// begin readies the connection for the watch's read, unless stop has begun. The head's
// deadline is still on the connection: the watch reads without one, and stop wakes it
// with one in the past. The lock orders the two; its unlock is deferred, so that a
// panic does not leave stop waiting for it.
func (w *GoneWatch) begin() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	_ = w.conn.SetReadDeadline(time.Time{})
	return true
}

// Stop ends the watch and waits for its read. It returns the byte the client sent
// meanwhile, if any; whether the client left is in the flag arm was given. The
// connection's read deadline is then
// in the past when the watch had begun: the next reader sets its own.
func (w *GoneWatch) Stop() (pending []byte) {
	if w.timer.Stop() {
		w.wg.Done()
		w.conn, w.req, w.left = nil, nil, nil
		return nil
	}
	w.mu.Lock()
	w.stopped = true
	_ = w.conn.SetReadDeadline(aLongTimeAgo)
	w.mu.Unlock()
	w.wg.Wait()
	w.conn, w.req, w.left = nil, nil, nil
	if w.got {
		return w.b[:]
	}
	return nil
}

// aLongTimeAgo is a deadline that has passed: it wakes a read in progress at once.
var aLongTimeAgo = time.Unix(1, 0)
