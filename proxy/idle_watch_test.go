package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A websocket whose bytes go one way only is not idle: each byte the client sends
// (up) or is sent (down) is a sign of life, however long the other way stays quiet, and
// every byte arrives.
func TestOneWayWebsocketIsNotIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, down := range []bool{false, true} {
		name := "up"
		if down {
			name = "down"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
			h.dns.set("ws.test", netip.MustParseAddr("127.0.0.9"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["ws.test"]}`)
			upstream := make(chan int, 1) // bytes the upstream sent (down) or received (up)
			port := serveTCP(t, "127.0.0.9", func(c net.Conn, done <-chan struct{}) {
				br := bufio.NewReader(c)
				if readHead(br) != nil {
					return
				}
				if _, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"); err != nil {
					return
				}
				if !down {
					n, _ := io.Copy(io.Discard, br)
					upstream <- int(n)
					return
				}
				sent := 0
				for end := time.Now().Add(4 * idle); time.Now().Before(end); sent++ {
					select {
					case <-done:
						return
					case <-time.After(idle / 6):
					}
					if _, err := io.WriteString(c, "x"); err != nil {
						break
					}
				}
				upstream <- sent
			}).Port
			c := h.dialProxy(t)
			fmt.Fprintf(c, "GET http://ws.test:%d/ HTTP/1.1\r\nHost: ws.test:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", port, port)
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			got := 0
			if down {
				b, err := io.ReadAll(br) // until the upstream's close, relayed
				if err != nil {
					t.Fatal(err)
				}
				got = len(b)
			} else {
				for end := time.Now().Add(4 * idle); time.Now().Before(end); got++ {
					time.Sleep(idle / 6)
					if _, err := io.WriteString(c, "x"); err != nil {
						t.Fatalf("write after %d bytes: %v", got, err)
					}
				}
				_ = c.(*net.TCPConn).CloseWrite()
			}
			var want int
			select {
			case want = <-upstream:
			case <-time.After(hangGuard):
				t.Fatal("the upstream did not finish")
			}
			if !down {
				got, want = want, got
			}
			if got != want {
				t.Fatalf("%d of %d bytes arrived: the relay was cut as idle", got, want)
			}
		})
	}
}

// A relay is cut a whole timeout after its last sign of life, and its start is one: a
// tunnel or websocket that never carries a byte lives the timeout out. When the cut
// comes is checked as a lower bound only: a loaded machine can only make it later.
func TestQuietRelayLivesTheTimeout(t *testing.T) {
	const idle = time.Second
	h := newHarness(t, func(c *Config) { c.TunnelIdleTimeout = idle })
	h.apply(`"public"`)
	for _, tc := range []struct {
		name string
		open func(t *testing.T) io.Reader
	}{
		{"tunnel", func(t *testing.T) io.Reader {
			_, tc := h.connect(h.a.echoHostPort("127.0.0.2"), "")
			if tc == nil {
				t.Fatal("CONNECT refused")
			}
			return tc
		}},
		{"websocket", func(t *testing.T) io.Reader {
			c := h.dialProxy(t)
			fmt.Fprintf(c, "GET http://127.0.0.2:%d/ws HTTP/1.1\r\nHost: 127.0.0.2:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", h.a.httpPort, h.a.httpPort)
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			return br
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := tc.open(t)
			if _, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("read %v, want EOF (closed by the proxy)", err)
			}
			if took := time.Since(start); took < idle {
				t.Fatalf("a relay that carried nothing was cut after %v, before the idle timeout %v", took, idle)
			}
		})
	}
}

// The watch of an answer body's reads through net/http's Transport counts a read's
// wait alone: the time between two reads, which the proxy spends writing what it read
// to a client that takes it slowly, is not the upstream's silence, however long.
func TestReadWatchIgnoresTheTimeBetweenReads(t *testing.T) {
	const timeout = 50 * time.Millisecond
	cut := make(chan struct{})
	var once sync.Once
	cl := &requestClient{cancel: func() { once.Do(func() { close(cut) }) }}
	var w readWatch
	w.timeout = timeout
	defer w.stop()
	r, p := strings.NewReader("ab"), make([]byte, 1)
	if _, err := w.read(r, p, cl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * timeout) // a write to a slow client; the watch's timer fires meanwhile
	select {
	case <-cut:
		t.Fatal("the request was cut between two reads")
	default:
	}
	if _, err := w.read(r, p, cl); err != nil {
		t.Fatalf("the next read: %v", err)
	}
}

// A stopped watch lets go of its timer: a timer left running would hold the relay or
// request it watches (its connections and buffers) for up to a timeout after its end.
func TestStoppedIdleWatchesReleaseTheirTimers(t *testing.T) {
	cl := &requestClient{cancel: func() { t.Error("a stopped watch cut its request") }}
	for _, tc := range []struct {
		name  string
		start func() (stop func(), timer func() *time.Timer)
	}{
		{"relay", func() (func(), func() *time.Timer) {
			var w idleWatch
			w.start(newIdleClock(time.Hour), func(any) { t.Error("a stopped watch ended its relay") })
			return w.stop, func() *time.Timer { return w.t }
		}},
		{"answer head", func() (func(), func() *time.Timer) {
			var w headWatch
			w.timeout = time.Hour
			w.wrote(cl)
			return w.stop, func() *time.Timer { return w.t }
		}},
		{"answer body", func() (func(), func() *time.Timer) {
			var w readWatch
			w.timeout = time.Hour
			if _, err := w.read(strings.NewReader("x"), make([]byte, 1), cl); err != nil {
				t.Fatal(err)
			}
			return w.stop, func() *time.Timer { return w.t }
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
	var w idleWatch
	clock := newIdleClock(time.Hour)
	w.start(clock, func(any) { ended = true })
	w.stop()
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
	waitFor(t, func() bool { return tcpMoved(sender.(*net.TCPConn)) >= n })
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

// quiesce waits for a websocket relay's write in progress to return and be counted:
// the counts a relay's end logs and adds to the byte metrics are final only then.
func TestQuiesceWaitsForTheWriteInProgress(t *testing.T) {
	conn := &heldWriteConn{entered: make(chan struct{}), release: make(chan struct{})}
	c := &idleConn{Conn: conn, clock: newIdleClock(time.Hour), up: new(atomic.Int64), down: new(atomic.Int64)}
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_, _ = c.Write([]byte("abc"))
	}()
	<-conn.entered
	quiesced := make(chan struct{})
	go func() {
		defer close(quiesced)
		c.quiesce()
	}()
	// Until quiesce waits for the lock (a reader can no longer take it), or returns.
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
	w := newIdleWriter(c, 100*time.Millisecond, errClientIdle)
	if n, err := w.Write([]byte("x")); n != 0 || !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("wrote %d, %v; want 0 and the connection's error, %v", n, err, io.ErrClosedPipe)
	}
}
