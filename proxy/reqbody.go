package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync"
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
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
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
