package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// idleClock is one relay's last sign of life, shared by its two directions. A direction
// learns how much it copied only when its copy returns (a splice reports nothing while
// it runs), so each direction's read deadline makes its copy return every half
// timeout: an active direction stamps the clock at least that often, and a direction
// whose deadline passes ends the relay only when neither direction has stamped it for
// a whole timeout. A relay is thus cut between one and one and a half timeouts after
// its last byte.
type idleClock struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds of the last progress seen
}

func newIdleClock(timeout time.Duration) *idleClock {
	c := &idleClock{timeout: timeout}
	c.touch()
	return c
}

func (c *idleClock) touch() { c.last.Store(time.Now().UnixNano()) }

// arm sets src's read deadline for the next period.
func (c *idleClock) arm(src net.Conn) { _ = src.SetReadDeadline(time.Now().Add(c.timeout / 2)) }

// idle reports whether no direction made progress for the timeout.
func (c *idleClock) idle() bool { return time.Since(time.Unix(0, c.last.Load())) >= c.timeout }

// watchIdle calls end once clock has seen no progress for its timeout, checking at
// most a timeout after the last progress. The function it returns stops the watch,
// for a relay that ended first.
func watchIdle(clock *idleClock, end func()) (stop func()) {
	var (
		mu      sync.Mutex
		t       *time.Timer
		stopped bool
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(clock.timeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if left := clock.timeout - time.Since(time.Unix(0, clock.last.Load())); left > 0 {
			t.Reset(left)
			return
		}
		end()
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// idleConn is the client side of a relay that is not spliced (a websocket): every read
// and write is a sign of life, counted in up (read) and down (written), and a read
// fails with the deadline's error once the relay has been idle for the clock's
// timeout.
type idleConn struct {
	net.Conn
	clock    *idleClock
	up, down *atomic.Int64
	// inFlight is held (shared) across each read and write with its count, so that
	// quiesce can wait for the last one.
	inFlight sync.RWMutex
}

func (c *idleConn) Read(p []byte) (int, error) {
	c.inFlight.RLock()
	defer c.inFlight.RUnlock()
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

func (c *idleConn) Write(p []byte) (int, error) {
	c.inFlight.RLock()
	defer c.inFlight.RUnlock()
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.down.Add(int64(n))
		c.clock.touch()
	}
	return n, err
}

// quiesce waits for the read and write in progress, if any, to return and be
// counted. Call it after closing the connection: later ones move no byte.
func (c *idleConn) quiesce() {
	c.inFlight.Lock()
	//lint:ignore SA2001 taking the lock is the wait for the reads and writes holding it
	c.inFlight.Unlock()
}
