package httpfront

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// fakeHandler answers every forwarded request 200 "ok", refuses every CONNECT with a
// 403, and records what the front refused and handed it.
type fakeHandler struct {
	mu       sync.Mutex
	refused  []string // typ/reason
	buffered [][]byte // the Buffered of each CONNECT
}

func (h *fakeHandler) Connect(r *Request, req *http.Request) bool {
	h.mu.Lock()
	h.buffered = append(h.buffered, r.Buffered)
	h.mu.Unlock()
	_, _ = io.WriteString(r.Conn, "HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	return false
}

func (h *fakeHandler) Forward(r *Request) Exchange { return &fakeExchange{cancel: r.Cancel} }

func (h *fakeHandler) Refused(typ, reason, host, client string, _ netip.AddrPort) {
	h.mu.Lock()
	h.refused = append(h.refused, typ+"/"+reason)
	h.mu.Unlock()
}

func (h *fakeHandler) Recovered(typ, client string, p any) {}

type fakeExchange struct{ cancel context.CancelFunc }

func (x *fakeExchange) Cancel()         { x.cancel() }
func (x *fakeExchange) Recovered(p any) {}
func (x *fakeExchange) Relayed() bool   { return false }
func (x *fakeExchange) AnswerErr() error {
	return nil
}
func (x *fakeExchange) Report(Event, error) {}
func (x *fakeExchange) Serve(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Length", "2")
	_, _ = io.WriteString(w, "ok")
}

// slotListener is a Listener whose slots are not bounded.
type slotListener struct{ net.Listener }

func (slotListener) Release() {}

// startFront serves a front on a loopback listener ln (nil: a new one) until the test
// ends.
func startFront(t *testing.T, ln net.Listener, h Handler, cfg Config) (*Front, string) {
	t.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Listener, cfg.Handler = slotListener{ln}, h
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, d := range []*time.Duration{&cfg.HeaderTimeout, &cfg.IdleTimeout, &cfg.TunnelIdleTimeout} {
		if *d == 0 {
			*d = time.Minute
		}
	}
	f := New(cfg)
	served := make(chan error, 1)
	go func() { served <- f.Serve() }()
	t.Cleanup(func() {
		ln.Close()
		<-served
		f.Shutdown(context.Background())
	})
	return f, ln.Addr().String()
}

// get fetches a page through the front on a new connection and returns it open.
func get(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	fmt.Fprintf(c, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: status %d", resp.StatusCode)
	}
	return c
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
	}
}

// TestWorkersAreReusedAndBounded: connections one after another are served by the
// one worker that waits between them, and after a burst no more than maxIdleWorkers
// stay to wait; the drain ends every worker (goleak, TestMain).
func TestWorkersAreReusedAndBounded(t *testing.T) {
	f, addr := startFront(t, nil, &fakeHandler{}, Config{})
	for range 5 {
		get(t, addr).Close()
		// A worker per connection would leave one more waiting each time.
		waitFor(t, func() bool { return f.IdleWorkers() == 1 })
	}
	const burst = maxIdleWorkers + 8
	conns := make([]net.Conn, burst)
	for i := range conns {
		conns[i] = get(t, addr) // each holds a worker while it stays open
	}
	if n := f.IdleWorkers(); n != 0 {
		t.Fatalf("%d idle workers with %d connections open, want 0", n, burst)
	}
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, func() bool { return f.IdleWorkers() == maxIdleWorkers })
	time.Sleep(50 * time.Millisecond) // a worker beyond the bound would show by now
	if n := f.IdleWorkers(); n != maxIdleWorkers {
		t.Fatalf("%d idle workers after the burst, want %d", n, maxIdleWorkers)
	}
}

// flakyListener fails its first Accept with EMFILE, then hands out its listener's.
type flakyListener struct {
	net.Listener
	calls atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.calls.Add(1) == 1 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// A failed accept (descriptors ran out) passes: the front waits and accepts again
// rather than stop serving for the rest of the task.
func TestFrontAcceptsAgainAfterAcceptFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	_, addr := startFront(t, fl, &fakeHandler{}, Config{})
	get(t, addr).Close()
	if n := fl.calls.Load(); n < 2 {
		t.Fatalf("%d accept calls, want the failed one and another", n)
	}
}

// TestConnectEarlyBytesAreTheTunnels: the bytes a client sent along with its CONNECT
// are the tunnel's own copy, not a view of the connection's reader. The front puts the
// reader back in its pool once the tunnel has the connection, and the next connection
// reads its head into it, possibly before the relay has forwarded the early bytes: a
// view would forward another client's bytes upstream (and is a data race).
func TestConnectEarlyBytesAreTheTunnels(t *testing.T) {
	h := &fakeHandler{}
	f := New(Config{Handler: h})
	client, peer := net.Pipe()
	defer peer.Close()
	go func() { _, _ = io.Copy(io.Discard, peer) }()
	br := bufio.NewReader(strings.NewReader("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\nearly"))
	req, err := http.ReadRequest(br)
	if err != nil {
		t.Fatal(err)
	}
	cc := &clientConn{c: client, br: br, remote: "127.0.0.1:1", out: connio.NewIdleWriter(client, time.Minute, connio.ErrClientIdle)}
	f.connect(cc, &Request{Ctx: context.Background(), Cancel: func() {}, f: f, cc: cc}, req)
	client.Close()
	// What the next connection does with the pooled reader: reads its head into it.
	br.Reset(strings.NewReader(strings.Repeat("X", br.Size())))
	_, _ = br.Peek(1)
	if len(h.buffered) != 1 || string(h.buffered[0]) != "early" {
		t.Fatalf("the CONNECT was handed %q; want the client's early bytes", h.buffered)
	}
}

// TestFrontLastAnswersAreBounded: the front's own last answers to a head it will not
// serve (malformed, too long, or cut by the drain) are written under the header
// timeout: a client that reads nothing cannot hold the worker and the connection slot.
func TestFrontLastAnswersAreBounded(t *testing.T) {
	h := &fakeHandler{}
	f := New(Config{Handler: h, HeaderTimeout: 200 * time.Millisecond})
	for _, tc := range []struct {
		name           string
		err            error
		drain, tooLong bool
		refused        string
	}{
		{"malformed", errors.New("malformed"), false, false, "http/" + ReasonMalformedRequest},
		{"too long", errHeadTooLong, false, true, "http/" + ReasonHeadTooLong},
		{"draining", net.ErrClosed, true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.refused = nil
			client, peer := net.Pipe() // nobody reads peer: every write blocks
			defer peer.Close()
			defer client.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				f.refuseHead(&clientConn{c: client, remote: "127.0.0.1:1"}, tc.err, tc.drain, tc.tooLong)
			}()
			select {
			case <-done:
			case <-time.After(hangGuard):
				client.Close()
				<-done
				t.Fatalf("a last answer to a client that reads nothing was still being written after %v", hangGuard)
			}
			if got := strings.Join(h.refused, ","); got != tc.refused {
				t.Errorf("refusals counted: %q, want %q", got, tc.refused)
			}
		})
	}
}
