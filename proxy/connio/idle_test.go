package connio

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/internal/testutil"
)

// hangGuard bounds a wait for something that should happen at once, on a loaded
// machine.
const hangGuard = 30 * time.Second

// fakeRequest is a Request whose Cancel calls cancel; a panic recovered fails the test.
type fakeRequest struct {
	t      *testing.T
	cancel func()
}

func (r *fakeRequest) Cancel() { r.cancel() }

func (r *fakeRequest) Recovered(p any) { r.t.Errorf("recovered a panic: %v", p) }

// The watch of an answer body's reads through net/http's Transport counts a read's
// wait alone: the time between two reads, which the proxy spends writing what it read
// to a client that takes it slowly, is not the upstream's silence, however long.
func TestReadWatchIgnoresTheTimeBetweenReads(t *testing.T) {
	const timeout = 50 * time.Millisecond
	cut := make(chan struct{})
	var once sync.Once
	cl := &fakeRequest{t: t, cancel: func() { once.Do(func() { close(cut) }) }}
	var w ReadWatch
	w.SetTimeout(timeout)
	defer w.Stop()
	r, p := strings.NewReader("ab"), make([]byte, 1)
	if _, err := w.Read(r, p, cl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * timeout) // a write to a slow client; the watch's timer fires meanwhile
	select {
	case <-cut:
		t.Fatal("the request was cut between two reads")
	default:
	}
	if _, err := w.Read(r, p, cl); err != nil {
		t.Fatalf("the next read: %v", err)
	}
}

// A stopped watch lets go of its timer: a timer left running would hold the relay or
// request it watches (its connections and buffers) for up to a timeout after its end.
func TestStoppedIdleWatchesReleaseTheirTimers(t *testing.T) {
	cl := &fakeRequest{t: t, cancel: func() { t.Error("a stopped watch cut its request") }}
	for _, tc := range []struct {
		name  string
		start func() (stop func(), timer func() *time.Timer)
	}{
		{"relay", func() (func(), func() *time.Timer) {
			var w IdleWatch
			w.Start(NewIdleClock(time.Hour), nil, 0, func(any) { t.Error("a stopped watch ended its relay") })
			return w.Stop, func() *time.Timer { return w.t }
		}},
		{"answer head", func() (func(), func() *time.Timer) {
			var w HeadWatch
			w.SetTimeout(time.Hour)
			w.Wrote(cl)
			return w.Stop, func() *time.Timer { return w.t }
		}},
		{"answer body", func() (func(), func() *time.Timer) {
			var w ReadWatch
			w.SetTimeout(time.Hour)
			if _, err := w.Read(strings.NewReader("x"), make([]byte, 1), cl); err != nil {
				t.Fatal(err)
			}
			return w.Stop, func() *time.Timer { return w.t }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop, timer := tc.start()
			stop()
			if timer().Stop() {
				t.Error("the stopped watch's timer still runs")
			}
		})
	}
}

// A relay's idle check that runs once its watch is stopped (its timer fired as the relay
// ended) does nothing: it neither ends the relay again nor restarts its timer.
func TestIdleCheckAfterStopDoesNothing(t *testing.T) {
	ended := false
	var w IdleWatch
	clock := NewIdleClock(time.Hour)
	w.Start(clock, nil, 0, func(any) { ended = true })
	w.Stop()
	clock.last.Store(monoNanos() - int64(2*time.Hour)) // idle for longer than its timeout
	w.check()
	if ended {
		t.Error("a check after the stop ended the relay")
	}
	if w.t.Stop() {
		t.Error("a check after the stop restarted the timer")
	}
}

// tcpMoved counts both what a socket received and what it sent that its peer
// acknowledged: a relay's write that a slow peer takes bit by bit, and its read of a
// sender, are each progress; a closed socket counts 0.
func TestTCPMovedCountsBothWays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	sender, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	receiver := <-accepted
	if receiver == nil {
		t.Fatal("accept failed")
	}
	defer receiver.Close()
	const n = 100
	if _, err := sender.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(receiver, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	// The acknowledgement may trail the read.
	testutil.WaitFor(t, hangGuard, func() bool { return tcpMoved(sender.(*net.TCPConn)) >= n })
	if got := tcpMoved(receiver.(*net.TCPConn)); got < n {
		t.Errorf("the receiving socket counts %d, want at least %d", got, n)
	}
	receiver.Close()
	if got := tcpMoved(receiver.(*net.TCPConn)); got != 0 {
		t.Errorf("a closed socket counts %d, want 0", got)
	}
}

// heldWriteConn is a connection whose writes wait for release, reporting on entered
// when the first begins.
type heldWriteConn struct {
	net.Conn
	entered, release chan struct{}
}

func (c *heldWriteConn) Write(p []byte) (int, error) {
	close(c.entered)
	<-c.release
	return len(p), nil
}

// Quiesce waits for a websocket relay's write in progress to return and be counted:
// the counts a relay's end logs and adds to the byte metrics are final only then.
func TestQuiesceWaitsForTheWriteInProgress(t *testing.T) {
	conn := &heldWriteConn{entered: make(chan struct{}), release: make(chan struct{})}
	c := NewIdleConn(conn, NewIdleClock(time.Hour), new(atomic.Int64), new(atomic.Int64), nil)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_, _ = c.Write([]byte("abc"))
	}()
	<-conn.entered
	quiesced := make(chan struct{})
	go func() {
		defer close(quiesced)
		c.Quiesce()
	}()
	// Until Quiesce waits for the lock (a reader can no longer take it), or returns.
	for waiting := false; !waiting; {
		select {
		case <-quiesced:
			close(conn.release)
			<-wrote
			t.Fatal("quiesce returned while a write was in progress")
		default:
		}
		if waiting = !c.inFlight.TryRLock(); !waiting {
			c.inFlight.RUnlock()
			time.Sleep(time.Millisecond)
		}
	}
	close(conn.release)
	<-quiesced
	if got := c.down.Load(); got != 3 {
		t.Errorf("counted %d bytes down once quiet, want 3", got)
	}
	<-wrote
}

// A write that fails for another reason than its deadline (the client reset or closed
// the connection) returns that error at once: not the idle bound's error after a
// whole timeout of writes retried in a busy loop.
func TestIdleWriterReturnsTheConnectionsError(t *testing.T) {
	c, peer := net.Pipe()
	defer c.Close()
	peer.Close()
	w := NewIdleWriter(c, 100*time.Millisecond, ErrClientIdle)
	if n, err := w.Write([]byte("x")); n != 0 || !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("wrote %d, %v; want 0 and the connection's error, %v", n, err, io.ErrClosedPipe)
	}
}

// An IdleWriter's write that the client takes longer than the timeout to read, but
// reads some of every moment, completes; one the client stops reading fails with
// ErrClientIdle, no sooner than a timeout after the last byte it took (each byte read
// moves the bound on). When it fails is a lower bound only: a write that never fails is
// caught by the hang guard, however late a loaded machine lets it return.
func TestIdleWriterCountsPartialProgress(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, tc := range []struct {
		name  string
		reads int // 1 KiB reads, 50 ms apart, before the client stops
		want  error
	}{
		{"slow reader", 16, nil},
		{"stalled reader", 4, ErrClientIdle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, peer := net.Pipe()
			defer c.Close()
			defer peer.Close()
			var last atomic.Int64
			go func() {
				buf := make([]byte, 1<<10)
				for range tc.reads {
					time.Sleep(50 * time.Millisecond)
					if _, err := peer.Read(buf); err != nil {
						return
					}
					last.Store(time.Now().UnixNano())
				}
			}()
			w := new(IdleWriter)
			*w = NewIdleWriter(c, timeout, ErrClientIdle)
			type result struct {
				n   int
				err error
			}
			wrote := make(chan result, 1)
			start := time.Now()
			go func() {
				n, err := w.Write(make([]byte, 16<<10))
				wrote <- result{n, err}
			}()
			var r result
			select {
			case r = <-wrote:
			case <-time.After(hangGuard):
				c.Close()
				<-wrote
				t.Fatalf("the write still blocked %v after it began: a stalled reader is never noticed", hangGuard)
			}
			if !errors.Is(r.err, tc.want) || r.n != tc.reads<<10 {
				t.Fatalf("wrote %d, %v; want %d, %v", r.n, r.err, tc.reads<<10, tc.want)
			}
			if tc.want == nil {
				if d := time.Since(start); d < 2*timeout {
					t.Fatalf("the write took %v, want several timeouts", d)
				}
				return
			}
			if idle := time.Since(time.Unix(0, last.Load())); idle < timeout {
				t.Fatalf("write failed %v after the last byte read, before the timeout %v", idle, timeout)
			}
		})
	}
}

// The reads of an https:// request's connection are under the Transport's TLS client:
// the watch finds ours beneath it, and lets go of it when it stops.
func TestHeadWatchFindsTheConnectionUnderTLS(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	uc := &UpstreamConn{IdleWriter: IdleWriter{Conn: a}}
	var w HeadWatch
	w.GotConn(tls.Client(uc, &tls.Config{ServerName: "x.test"}))
	if uc.head.Load() != &w {
		t.Fatal("the watch did not find the connection under the TLS client")
	}
	w.Stop()
	if uc.head.Load() != nil {
		t.Fatal("the connection still points at a stopped watch")
	}
}

// TestIdleWatchKeepAliveOrders: a tunnel's watch cuts an idle tunnel whatever the
// order of its keep-alive time and its idle timeout, turns the keep-alive on when the
// tunnel lives past that time and not before (a tunnel active for a while gets checks
// before it), and leaves no timer pending once it has cut the tunnel.
func TestIdleWatchKeepAliveOrders(t *testing.T) {
	for _, tc := range []struct {
		name            string
		idle, keepAfter time.Duration
		active          time.Duration // the clock sees progress this long
		keepAlive       bool          // on when the watch cuts the tunnel
	}{
		{"keep-alive due long before the idle cut", time.Second, time.Millisecond, 0, true},
		{"keep-alive due after the idle cut", 100 * time.Millisecond, time.Hour, 0, false},
		{"checks of an active tunnel before the keep-alive is due", 100 * time.Millisecond, time.Hour, 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, _ := testutil.TCPPair(t)
			var w IdleWatch
			ended := make(chan any, 1)
			clock := NewIdleClock(tc.idle)
			w.Start(clock, up, tc.keepAfter, func(p any) { ended <- p })
			defer w.Stop()
			for start := time.Now(); time.Since(start) < tc.active; time.Sleep(10 * time.Millisecond) {
				clock.touch()
			}
			select {
			case p := <-ended:
				if p != nil {
					t.Fatalf("the watch panicked: %v", p)
				}
			case <-time.After(hangGuard):
				t.Fatalf("an idle tunnel (timeout %v, keep-alive after %v) is still open after %v",
					tc.idle, tc.keepAfter, hangGuard)
			}
			if on := testutil.TCPSockopt(t, up, unix.SOL_SOCKET, unix.SO_KEEPALIVE) == 1; on != tc.keepAlive {
				t.Errorf("keep-alive on when the tunnel was cut: %v, want %v", on, tc.keepAlive)
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.t.Stop() {
				t.Error("the watch's timer is still pending after it cut the tunnel")
			}
		})
	}
}
