package proxybench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bounds every measurement in time and in count, so that a slow or stuck proxy
// cannot make the benchmark run away.
type Limits struct {
	Duration        time.Duration // length of each rate or throughput measurement
	BulkBytes       int64         // most bytes one bulk measurement reads
	Setups          int           // most tunnel set-ups one measurement makes
	Requests        int           // most forward requests one measurement makes
	Concurrency     int           // parallel clients for set-ups and requests
	LatencyRequests int           // sequential requests whose latency is recorded
	IdleTunnels     int           // tunnels held open for the memory measurement
}

// DefaultLimits keeps a five-target, nine-round run within about four minutes: many
// short rounds give medians that shrug off bursts of other load on the machine.
func DefaultLimits() Limits {
	return Limits{
		Duration:        time.Second,
		BulkBytes:       8 << 30,
		Setups:          200_000,
		Requests:        1_000_000,
		Concurrency:     32,
		LatencyRequests: 2000,
		IdleTunnels:     2000,
	}
}

// Rate is a count of completed operations over the time they took.
type Rate struct {
	Ops     int64
	Errors  int64
	Elapsed time.Duration
}

// PerSecond is the rate in operations per second.
func (r Rate) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Bulk reads from one tunnel to the stream upstream for lim.Duration (or lim.BulkBytes)
// and returns the bytes read as Ops.
func Bulk(t Target, streamAddr string, lim Limits) (r Rate, err error) {
	enterErr := t.run(func() error {
		r, err = bulk(t, streamAddr, lim)
		return nil
	})
	if enterErr != nil {
		return Rate{}, fmt.Errorf("bulk: %w", enterErr)
	}
	return r, err
}

func bulk(t Target, streamAddr string, lim Limits) (Rate, error) {
	c, r, err := dialTunnel(t, streamAddr)
	if err != nil {
		return Rate{}, fmt.Errorf("bulk: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{modeBulk}); err != nil {
		return Rate{}, fmt.Errorf("bulk: %w", err)
	}
	buf := make([]byte, 256<<10)
	// The clock starts at the first byte, so that the set-up is not part of the rate.
	if _, err := io.ReadFull(r, buf[:1]); err != nil {
		return Rate{}, fmt.Errorf("bulk: %w", err)
	}
	start := time.Now()
	deadline := start.Add(lim.Duration)
	c.SetReadDeadline(deadline)
	var n int64
	for n < lim.BulkBytes {
		k, err := r.Read(buf)
		n += int64(k)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			return Rate{}, fmt.Errorf("bulk: after %d bytes: %w", n, err)
		}
	}
	return Rate{Ops: n, Elapsed: time.Since(start)}, nil
}

// Setups opens, uses (one byte each way) and closes tunnels from lim.Concurrency
// clients for lim.Duration (or lim.Setups tunnels). The upstream ends each tunnel; the
// client closes once the end reached it through the proxy.
func Setups(t Target, streamAddr string, lim Limits) Rate {
	return parallel(t, lim.Concurrency, lim.Duration, int64(lim.Setups), func() func() error {
		return func() error {
			c, r, err := dialTunnel(t, streamAddr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(ioTimeout))
			if _, err := c.Write([]byte{modeEcho}); err != nil {
				return err
			}
			if b, err := r.ReadByte(); err != nil || b != modeEcho {
				return fmt.Errorf("set-up: echo %q, %v", b, err)
			}
			if _, err := r.ReadByte(); err != io.EOF {
				return fmt.Errorf("set-up: want the upstream's close, got %v", err)
			}
			return nil
		}
	})
}

// Requests sends forward GETs on lim.Concurrency keep-alive connections for
// lim.Duration (or lim.Requests requests).
func Requests(t Target, httpAddr string, lim Limits) Rate {
	var mu sync.Mutex
	var clients []*httpConn
	defer func() {
		for _, h := range clients {
			h.Close()
		}
	}()
	return parallel(t, lim.Concurrency, lim.Duration, int64(lim.Requests), func() func() error {
		h := newHTTPConn(t, httpAddr)
		mu.Lock()
		clients = append(clients, h)
		mu.Unlock()
		return h.get
	})
}

// parallel runs workers op functions (one per worker, made by newOp) until the time or
// the shared operation budget runs out. Each worker runs in t's client namespace.
func parallel(t Target, workers int, d time.Duration, budget int64, newOp func() func() error) Rate {
	var ops, errs, claimed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range workers {
		op := newOp()
		wg.Go(func() {
			err := t.run(func() error {
				for time.Now().Before(deadline) && claimed.Add(1) <= budget {
					if err := op(); err != nil {
						errs.Add(1)
						// A failing proxy must not turn the loop into a busy spin.
						time.Sleep(10 * time.Millisecond)
						continue
					}
					ops.Add(1)
				}
				return nil
			})
			if err != nil {
				errs.Add(1)
			}
		})
	}
	wg.Wait()
	return Rate{Ops: ops.Load(), Errors: errs.Load(), Elapsed: time.Since(start)}
}

// Latencies sends lim.LatencyRequests sequential GETs on one keep-alive connection
// (after a short warm-up) and returns each one's duration. It stops early after
// lim.Duration.
func Latencies(t Target, httpAddr string, lim Limits) (samples []time.Duration, err error) {
	enterErr := t.run(func() error {
		samples, err = latencies(t, httpAddr, lim)
		return nil
	})
	if enterErr != nil {
		return nil, fmt.Errorf("latency: %w", enterErr)
	}
	return samples, err
}

func latencies(t Target, httpAddr string, lim Limits) ([]time.Duration, error) {
	h := newHTTPConn(t, httpAddr)
	defer h.Close()
	for range 50 {
		if err := h.get(); err != nil {
			return nil, fmt.Errorf("latency: warm-up: %w", err)
		}
	}
	samples := make([]time.Duration, 0, lim.LatencyRequests)
	stop := time.Now().Add(lim.Duration)
	for len(samples) < lim.LatencyRequests && time.Now().Before(stop) {
		t0 := time.Now()
		if err := h.get(); err != nil {
			return samples, fmt.Errorf("latency: %w", err)
		}
		samples = append(samples, time.Since(t0))
	}
	return samples, nil
}

// IdleMemory opens lim.IdleTunnels idle tunnels and returns the growth of the proxy's
// resident memory per tunnel, in bytes, and how many tunnels it could open.
func IdleMemory(t Target, streamAddr string, lim Limits, settle time.Duration) (perTunnel float64, opened int, err error) {
	if t.Direct() || t.PIDs == nil {
		return 0, 0, errors.New("idle memory: target has no process")
	}
	before, err := RSS(t.PIDs())
	if err != nil {
		return 0, 0, fmt.Errorf("idle memory: %w", err)
	}
	conns := make([]net.Conn, lim.IdleTunnels)
	var failures atomic.Int64
	var errMu sync.Mutex
	var firstErr error
	var next atomic.Int64
	var wg sync.WaitGroup
	for range lim.Concurrency {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(conns)); i = next.Add(1) - 1 {
				c, r, err := dialTunnel(t, streamAddr)
				if err == nil {
					c.SetDeadline(time.Now().Add(ioTimeout))
					if _, err = c.Write([]byte{modeIdle}); err == nil {
						_, err = r.ReadByte()
					}
					c.SetDeadline(time.Time{})
					if err != nil {
						c.Close()
					}
				}
				if err != nil {
					failures.Add(1)
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					continue
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	opened = len(conns) - int(failures.Load())
	if opened == 0 {
		return 0, 0, fmt.Errorf("idle memory: no tunnel opened: %w", firstErr)
	}
	time.Sleep(settle)
	after, err := RSS(t.PIDs())
	if err != nil {
		return 0, opened, fmt.Errorf("idle memory: %w", err)
	}
	return float64(after-before) / float64(opened), opened, nil
}
