package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// clientWatchDelay is how long a request without a body waits for the end of its answer
// before the front starts watching its client: a request answered sooner never pays the
// watch's system calls.
const clientWatchDelay = time.Second

// goneWatch notices a client that leaves while its request waits for the upstream's
// answer, or while the answer streams. A model call can take minutes before its answer
// head, and nothing else reads the client's connection meanwhile: without the watch the
// upstream would work on for a client long gone, until the answer came or idled out.
// The watch reads one byte. An end or an error of the connection (a close, a reset, a
// half-close, which squid's default and net/http's server also take for a client that
// left) cancels the request; a byte (the start of a pipelined request) is kept for the
// next head and ends the watch. Each client connection has one, armed per request.
type goneWatch struct {
	timer *time.Timer
	cl    *requestClient // the request's (and its connection), while armed
	left  *atomic.Bool   // the request's clientLeft, while armed
	wg    sync.WaitGroup // the armed watch, until it is stopped or its read returns

	mu      sync.Mutex
	stopped bool // stop has begun: a read not yet started must not start

	b   [1]byte
	got bool // b holds a byte the client sent
}

// arm starts the watch of the request of cl after delay; stop must follow. A client
// that leaves sets left, then cancels.
func (w *goneWatch) arm(cl *requestClient, delay time.Duration, left *atomic.Bool) {
	w.cl, w.left, w.stopped, w.got = cl, left, false, false
	w.wg.Add(1)
	if w.timer == nil {
		w.timer = time.AfterFunc(delay, w.watch)
	} else {
		w.timer.Reset(delay)
	}
}

func (w *goneWatch) watch() {
	defer w.wg.Done()
	// The timer runs the watch on a goroutine of its own, which nothing else recovers:
	// a panic cuts the request and its connection, not the process. Before wg.Done,
	// which lets stop forget the request.
	defer func() {
		if p := recover(); p != nil {
			w.cl.recovered(p)
		}
	}()
	if !w.begin() {
		return
	}
	n, err := w.cl.conn.Read(w.b[:])
	switch {
	case n == 1:
		w.got = true
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
		// stopped, the drain's wake-up, or the proxy's own close (a swap's cut)
	default:
		w.left.Store(true)
		w.cl.cancel()
	}
}

// begin readies the connection for the watch's read, unless stop has begun. The head's
// deadline is still on the connection: the watch reads without one, and stop wakes it
// with one in the past. The lock orders the two; its unlock is deferred, so that a
// panic does not leave stop waiting for it.
func (w *goneWatch) begin() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	_ = w.cl.conn.SetReadDeadline(time.Time{})
	return true
}

// stop ends the watch and waits for its read. It returns the byte the client sent
// meanwhile, if any; whether the client left is in the flag arm was given. The
// connection's read deadline is then
// in the past when the watch had begun: the next reader sets its own.
func (w *goneWatch) stop() (pending []byte) {
	if w.timer.Stop() {
		w.wg.Done()
		w.cl, w.left = nil, nil
		return nil
	}
	w.mu.Lock()
	w.stopped = true
	_ = w.cl.conn.SetReadDeadline(aLongTimeAgo)
	w.mu.Unlock()
	w.wg.Wait()
	w.cl, w.left = nil, nil
	if w.got {
		return w.b[:]
	}
	return nil
}

// aLongTimeAgo is a deadline that has passed: it wakes a read in progress at once.
var aLongTimeAgo = time.Unix(1, 0)
