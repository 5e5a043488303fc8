// Package httpfront is the sidecar's HTTP/1 front: it accepts the proxy's client
// connections, reads each request head with net/http's parser, refuses the heads a
// server behind the proxy could read otherwise, hands a CONNECT and every other
// request to its Handler (the sidecar: decisions, tunnels, goproxy), answers forwarded
// requests through a lean response writer, and drains.
//
// It replaces net/http's server for this listener: the server's per-connection and
// per-request machinery (contexts, background reads, its response writer) was the
// largest share of the proxy's own CPU per tunnel set-up and per forwarded request,
// and it drops the Host field of absolute-form requests before a handler can compare
// it with the URI.
package httpfront

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Listener is where the front's connections come from; each holds a slot of it until
// Release.
type Listener interface {
	Accept() (net.Conn, error)
	Release()
}

// Config is what the front is given.
type Config struct {
	Listener Listener
	Handler  Handler
	Log      *slog.Logger
	// HeaderTimeout bounds a head's read and the front's last answers, IdleTimeout the
	// wait for a kept connection's next head, TunnelIdleTimeout a request body or an
	// answer that moves no byte (see clientReader, connio.IdleWriter).
	HeaderTimeout, IdleTimeout, TunnelIdleTimeout time.Duration
	// ClientWatchDelay is how long a request without a body waits for the end of its
	// answer before the front watches its client (0: ClientWatchDelay).
	ClientWatchDelay time.Duration
}

// ClientWatchDelay is the default Config.ClientWatchDelay: a request answered sooner
// never pays the client-gone watch's system calls.
const ClientWatchDelay = time.Second

// Front serves the proxy's client connections.
type Front struct {
	cfg  Config
	h    Handler
	done chan struct{}
	once sync.Once

	mu    sync.Mutex
	conns map[net.Conn]*connState // open client connections
	wg    sync.WaitGroup          // their goroutines

	work    chan net.Conn  // a new connection, to a worker that waits for one
	idle    atomic.Int32   // workers waiting on work
	workers sync.WaitGroup // every worker
}

// connState is what the drain needs of a connection.
type connState struct {
	waiting bool               // for a request head: it may be closed at once
	cancel  context.CancelFunc // ends its request, upstream side included
}

// New is a front that serves cfg.Listener's connections for cfg.Handler, once Serve runs.
func New(cfg Config) *Front {
	if cfg.ClientWatchDelay == 0 {
		cfg.ClientWatchDelay = ClientWatchDelay
	}
	return &Front{cfg: cfg, h: cfg.Handler, done: make(chan struct{}), conns: make(map[net.Conn]*connState), work: make(chan net.Conn)}
}

// maxDrainBytes is how much of a request body nobody read is discarded to keep the
// connection for another request; a longer rest closes it instead.
const maxDrainBytes = 256 << 10

// Accept failures other than a closed listener (EMFILE, ENFILE, ENOBUFS) pass when
// connections end: the front waits, from acceptRetryMin doubling to acceptRetryMax,
// and accepts again, rather than stop serving the sandbox for the rest of its task.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// Serve accepts until the listener closes.
func (f *Front) Serve() error {
	defer close(f.work) // Serve alone sends on it; its end lets the waiting workers end
	var retry time.Duration
	for {
		c, err := f.cfg.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				f.Close()
				return err
			}
			retry = min(max(2*retry, acceptRetryMin), acceptRetryMax)
			f.cfg.Log.Warn("accept failed", "error", err.Error(), "retry_seconds", retry.Seconds())
			t := time.NewTimer(retry)
			select {
			case <-t.C:
			case <-f.done:
				t.Stop()
				return nil
			}
			continue
		}
		retry = 0
		if !f.Handle(c) {
			c.Close()
			f.cfg.Listener.Release()
		}
	}
}

// Handle serves c, a connection that holds a slot of the listener, on a worker, and
// reports false (c untouched) once the drain has begun.
func (f *Front) Handle(c net.Conn) bool {
	if !f.track(c) {
		return false
	}
	f.dispatch(c)
	return true
}

// maxIdleWorkers bounds the workers that wait for a connection; the others end with
// theirs.
const maxIdleWorkers = 16

// dispatch hands c to a worker that waits for one, or to a new worker.
func (f *Front) dispatch(c net.Conn) {
	select {
	case f.work <- c:
	default:
		f.workers.Add(1)
		go f.worker(c)
	}
}

// worker serves c, then whatever connection dispatch hands it while it is one of the
// few waiting. A goroutine per connection grew its stack from the starting size to
// 8 KiB on every tunnel set-up, and the runtime's copy of the stack, a walk of every
// frame, was the largest user-space cost of a set-up after the system calls
// (docs/bench.md); a worker keeps its grown stack from one connection to the next.
func (f *Front) worker(c net.Conn) {
	defer f.workers.Done()
	for {
		f.serveConn(c, netip.AddrPort{})
		if f.idle.Add(1) > maxIdleWorkers {
			f.idle.Add(-1)
			return
		}
		var ok bool
		c, ok = <-f.work
		f.idle.Add(-1)
		if !ok {
			return
		}
	}
}

// track registers a new connection, unless the drain has begun.
func (f *Front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		return false
	default:
	}
	f.conns[c] = &connState{waiting: true, cancel: func() {}}
	f.wg.Add(1)
	return true
}

// waiting marks c as waiting for a request head, the state in which the drain may
// close it at once, or (cancel not nil) as serving a request that cancel ends. It
// reports false when the drain has begun.
func (f *Front) waiting(c net.Conn, cancel context.CancelFunc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.conns[c]; ok {
		st.waiting = cancel == nil
		if cancel != nil {
			st.cancel = cancel
		}
	}
	select {
	case <-f.done:
		return false
	default:
		return true
	}
}

// cancelRequest ends the context of the request c serves, if any, which a panic
// left uncancelled: its upstream exchange or dial ends with it.
func (f *Front) cancelRequest(c net.Conn) {
	f.mu.Lock()
	st := f.conns[c]
	f.mu.Unlock()
	if st != nil {
		st.cancel()
	}
}

func (f *Front) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	f.wg.Done()
}

func (f *Front) draining() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// Conns is the number of client connections the front serves.
func (f *Front) Conns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// IdleWorkers is the number of workers waiting for a connection.
func (f *Front) IdleWorkers() int { return int(f.idle.Load()) }

// Close begins the drain: no new connections, and every connection waiting for a head
// is woken (its read deadline passes) to close; connections in a request close after
// their response.
func (f *Front) Close() {
	f.once.Do(func() {
		f.mu.Lock()
		close(f.done)
		for c, st := range f.conns {
			if st.waiting {
				_ = c.SetReadDeadline(time.Now())
			}
		}
		f.mu.Unlock()
	})
}

// Shutdown drains (Close) and returns when every connection has ended, or when ctx
// ends: then it closes the connections still open and waits for their goroutines.
// The listener must be closed first: the waiting workers end with Serve.
func (f *Front) Shutdown(ctx context.Context) {
	f.Close()
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		f.mu.Lock()
		for c, st := range f.conns {
			c.Close()
			st.cancel()
		}
		f.mu.Unlock()
		<-done
	}
	f.workers.Wait()
}
