package connio

import (
	"context"
	"sync"
	"time"
)

// DialStop ends a tunnel's dial: the attempt in flight and every later one. A tunnel's
// attempts run under contexts of their own rather than children of the request's:
// a child costs its parent a registration (a map and a channel, about 360 bytes of
// every tunnel set-up, which an idle tunnel's memory counts until a collection runs;
// docs/bench.md). So the cut of a swap and the drain's deadline, which end the
// request's context, reach the dial through stop instead.
type DialStop struct {
	mu      sync.Mutex
	cancel  context.CancelFunc // the attempt's in flight, if any
	stopped bool
}

// Attempt returns the context of one attempt, bounded by timeout, already ended when
// stop came first; done releases it.
func (d *DialStop) Attempt(timeout time.Duration) (ctx context.Context, done context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		cancel()
	}
	d.cancel = cancel
	return ctx, cancel
}

// Stop ends the attempt in flight and every later one.
func (d *DialStop) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.cancel != nil {
		d.cancel()
	}
}
