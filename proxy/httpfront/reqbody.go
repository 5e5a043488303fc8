package httpfront

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// requestBody is the body of a request the front serves. The upstream transport copies
// a body on a goroutine of its own, which may still be reading after the answer came
// back and the handler returned (an upstream that answered early, a 100-continue); the
// body reads from the connection's reader, which the front reuses for the next request
// and pools when the connection ends. So the front ends every body itself (end) before
// it touches the reader again: later reads fail, and what nobody read is discarded
// under a bound. Close only stops reading: it never drains, unlike the body net/http
// returns, so a transport goroutine cannot hold a connection by reading a body to its end.
type requestBody struct {
	mu     sync.Mutex
	rc     io.ReadCloser
	closed bool // no read may reach rc any more
	eof    bool
	// beforeRead runs before the first read (the 100-continue answer).
	beforeRead func()
	// trailer is the request's trailer, which net/http's reader fills at the body's
	// end with every field the client sent there; declared lists the fields the
	// client's Trailer field announced.
	trailer  http.Header
	declared []string
	// readErr is the first error a read met other than the body's end: a broken
	// framing or the connection's end is the client's doing, not the upstream's.
	readErr error
}

// newRequestBody wraps req's body for the front.
func newRequestBody(req *http.Request) *requestBody {
	b := &requestBody{rc: req.Body, trailer: req.Trailer}
	for k := range req.Trailer {
		b.declared = append(b.declared, k)
	}
	return b
}

func (b *requestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if f := b.beforeRead; f != nil {
		b.beforeRead = nil
		f()
	}
	n, err := b.rc.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		b.eof = true
		b.dropTrailerFields()
	case err != nil && b.readErr == nil:
		b.readErr = err
	}
	return n, err
}

// dropTrailerFields keeps of the trailer only the fields the client announced, and
// none that frames or routes a request (RFC 9110, 6.5.1): the transport writes the
// trailer upstream once the body ends, and a server there that merged it into the
// head would read a Host or a Content-Length the decision never saw. A trailer of more
// fields than a head may have goes whole (a recipient may discard a trailer): kept, it
// would hold the memory the head's bound saves until the answer came (MaxHeadFields).
func (b *requestBody) dropTrailerFields() {
	if FieldCount(b.trailer) > MaxHeadFields {
		clear(b.trailer)
		return
	}
	for k := range b.trailer {
		if framingField(k) || !slices.Contains(b.declared, k) {
			delete(b.trailer, k)
		}
	}
}

// bodyFramingError reports whether err, from net/http's reader of a request body, is
// the body's framing (a malformed chunk), not the connection ending, failing or
// idling.
func bodyFramingError(err error) bool {
	var opErr *net.OpError
	return err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) &&
		!errors.As(err, &opErr) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) &&
		!errors.Is(err, connio.ErrClientBodyIdle) && !errors.Is(err, http.ErrBodyReadAfterClose)
}

// clientFault says why the body failed through the client's doing: it was malformed
// (with the framing error), or the client ended the connection before its end. It is
// false for a body read whole or stopped by anything else.
func (b *requestBody) clientFault() (malformed error, cutShort bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if bodyFramingError(b.readErr) {
		return b.readErr, false
	}
	return nil, errors.Is(b.readErr, io.ErrUnexpectedEOF)
}

func (b *requestBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// done reports whether the body was read to its end. It never waits: a read in
// progress means the body has not ended.
func (b *requestBody) done() bool {
	if !b.mu.TryLock() {
		return false
	}
	defer b.mu.Unlock()
	return b.eof
}

// end seals the body against every later read and discards what is left of it, up to
// max bytes. It reports whether the body was read to its end, so that the connection
// can carry another request. A read in progress holds the lock: the caller first sets
// a read deadline so that it returns.
func (b *requestBody) end(max int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.eof {
		return true
	}
	_, err := io.CopyN(io.Discard, b.rc, max+1)
	b.eof = errors.Is(err, io.EOF)
	return b.eof
}

// clientReader is a client connection as the front reads it: limited to the N bytes a
// head may still take while a head is read, and, while a request body is read, bounded
// by the tunnel idle timeout. A body the client stops sending for that long fails the
// read with connio.ErrClientBodyIdle: it must not hold the request's goroutine, connection
// slot and upstream connection for ever, and a client that keeps sending, however
// slowly, is not cut (see connio.IdleDeadline), unless the front set a deadline to end the
// body (stopBody). A request without a body costs nothing more than the limit.
type clientReader struct {
	c   net.Conn
	N   int64  // bytes a head may still take; math.MaxInt64 while none is read
	pre []byte // read from c by the front's watch (connio.GoneWatch): the next bytes
	// body is the bound of the body being read, with a timeout of 0 while none is. The
	// front sets it and the fields below before the body's first read and resets them
	// after the body's end.
	body    connio.IdleDeadline
	idled   atomic.Bool
	mu      sync.Mutex // orders the body's deadline moves against stopBody
	stopped bool       // the front set a deadline of its own: obeyed
}

func (r *clientReader) Read(p []byte) (int, error) {
	if r.N <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.N {
		p = p[:r.N]
	}
	var n int
	var err error
	if len(r.pre) > 0 {
		n = copy(p, r.pre)
		r.pre = r.pre[n:]
	} else if r.body.Timeout() > 0 {
		n, err = r.readBody(p)
	} else {
		n, err = r.c.Read(p)
	}
	r.N -= int64(n)
	return n, err
}

func (r *clientReader) readBody(p []byte) (int, error) {
	start := time.Now()
	if r.body.Due(start) {
		r.mu.Lock()
		if !r.stopped {
			r.body.Begin(start)
		}
		r.mu.Unlock()
	}
	for {
		n, err := r.c.Read(p)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if err := r.deadlinePassed(start, err); err != nil {
			return 0, err
		}
	}
}

// deadlinePassed moves the deadline that passed in a read begun at start, unless it
// must be obeyed: then it returns the error that ends the read, err for the front's own
// deadline, connio.ErrClientBodyIdle once the timeout since start has passed.
func (r *clientReader) deadlinePassed(start time.Time, err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return err
	}
	if r.body.Passed(start) {
		r.idled.Store(true)
		return connio.ErrClientBodyIdle
	}
	return nil
}

// startBody bounds the reads of a request body by idle.
func (r *clientReader) startBody(idle time.Duration) {
	r.body = connio.NewIdleDeadline(r.c, false, idle)
	r.body.Set(time.Now().Add(idle))
}

// stopBody sets a read deadline that the body's reads obey (one in progress may be on
// another goroutine), to end the body.
func (r *clientReader) stopBody(deadline time.Time) {
	r.mu.Lock()
	r.stopped = true
	_ = r.c.SetReadDeadline(deadline)
	r.mu.Unlock()
}

// bodyIdle reports whether a read of the body failed with connio.ErrClientBodyIdle.
func (r *clientReader) bodyIdle() bool { return r.idled.Load() }

// endBody ends the bound once no read of the body can come any more.
func (r *clientReader) endBody() {
	r.body, r.stopped = connio.IdleDeadline{}, false
	r.idled.Store(false)
}
