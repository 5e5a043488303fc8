package jsonlog

import (
	"io"
	"sync"
	"time"
)

// BufferedWriter batches log lines: each Write appends to a buffer, which goes to the
// underlying writer in one write at most delay after the first line it holds, as soon
// as the next line would take it past size, and on Flush and Close. compass-proxy
// writes a line per request and two per tunnel; a write system call for each is what
// batching saves. The price is that a process killed outright loses at most delay's
// worth of lines; an orderly exit calls Close.
//
// Lines are never split: a line longer than size is written on its own, after the
// buffered ones. After Close, writes go straight through, so a last line logged after
// Close is not lost either. This package's handler flushes it after every record at
// WARN or above, so that denied decisions and errors are never held back.
type BufferedWriter struct {
	w     io.Writer
	delay time.Duration
	size  int

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer
	armed  bool // the timer will flush buf
	closed bool
}

// NewBufferedWriter returns a BufferedWriter on w. delay and size must be positive.
func NewBufferedWriter(w io.Writer, delay time.Duration, size int) *BufferedWriter {
	b := &BufferedWriter{w: w, delay: delay, size: size, buf: make([]byte, 0, size)}
	b.timer = time.AfterFunc(delay, b.flushLater)
	b.timer.Stop()
	return b
}

// Write buffers p, which the caller must not hold past the call (slog handlers reuse
// it). It reports the error of a write of earlier lines that p's size set off; p is
// kept all the same, for the next write, which may succeed.
func (b *BufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.w.Write(p)
	}
	var err error
	if len(b.buf)+len(p) > b.size {
		err = b.flushLocked()
		if len(p) > b.size {
			if _, werr := b.w.Write(p); err == nil {
				err = werr
			}
			return len(p), err
		}
	}
	b.buf = append(b.buf, p...)
	if !b.armed {
		b.armed = true
		b.timer.Reset(b.delay)
	}
	return len(p), err
}

// Flush writes the buffered lines now.
func (b *BufferedWriter) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

// Close writes the buffered lines and stops batching.
func (b *BufferedWriter) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.timer.Stop()
	b.armed = false
	return b.flushLocked()
}

// flushLater is the timer's flush. A write error has no caller to go to; the lines
// are dropped, as an unbuffered write's failed line would be.
func (b *BufferedWriter) flushLater() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	_ = b.flushLocked()
}

func (b *BufferedWriter) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}
