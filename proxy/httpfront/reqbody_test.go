package httpfront

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// A body error that is the framing (a malformed chunk) is the client's malformed
// request; the connection ending, failing, idling or the body being closed is not.
func TestBodyFramingError(t *testing.T) {
	framing := errors.New("malformed chunked encoding")
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{framing, true},
		{fmt.Errorf("wrapped: %w", framing), true},
		{io.EOF, false},
		{io.ErrUnexpectedEOF, false},
		{&net.OpError{Op: "read", Err: errors.New("connection reset")}, false},
		{os.ErrDeadlineExceeded, false},
		{net.ErrClosed, false},
		{connio.ErrClientBodyIdle, false},
		{http.ErrBodyReadAfterClose, false},
	} {
		if got := bodyFramingError(tc.err); got != tc.want {
			t.Errorf("bodyFramingError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// errReader fails its reads with errs in turn, then with the last one.
type errReader struct{ errs []error }

func (r *errReader) Read([]byte) (int, error) {
	err := r.errs[0]
	if len(r.errs) > 1 {
		r.errs = r.errs[1:]
	}
	return 0, err
}

func (r *errReader) Close() error { return nil }

// clientFault names the first error a read met: a malformed chunk the client sent, not
// the connection's end that followed it.
func TestClientFaultIsTheFirstError(t *testing.T) {
	framing := errors.New("malformed chunked encoding")
	for _, tc := range []struct {
		errs      []error
		malformed error
		cutShort  bool
	}{
		{[]error{framing, io.ErrUnexpectedEOF}, framing, false},
		{[]error{io.ErrUnexpectedEOF, framing}, nil, true},
		{[]error{io.EOF}, nil, false},
	} {
		b := &requestBody{rc: &errReader{errs: tc.errs}}
		for range 2 {
			_, _ = b.Read(make([]byte, 8))
		}
		malformed, cutShort := b.clientFault()
		if malformed != tc.malformed || cutShort != tc.cutShort {
			t.Errorf("errors %v: clientFault %v, %v; want %v, %v", tc.errs, malformed, cutShort, tc.malformed, tc.cutShort)
		}
	}
}

// end discards up to max bytes: a rest of exactly max bytes is read to its end, and the
// connection can carry another request; one byte more and it cannot. After end (or
// Close), no read reaches the connection's reader.
func TestRequestBodyEnd(t *testing.T) {
	for _, tc := range []struct {
		rest int
		want bool
	}{{0, true}, {9, true}, {10, true}, {11, false}} {
		rc := io.NopCloser(strings.NewReader(strings.Repeat("x", tc.rest)))
		b := &requestBody{rc: rc}
		if got := b.end(10); got != tc.want {
			t.Errorf("rest %d: end(10) = %v, want %v", tc.rest, got, tc.want)
		}
	}
	for _, seal := range []string{"end", "Close"} {
		r := strings.NewReader("body")
		b := &requestBody{rc: io.NopCloser(r)}
		if seal == "end" {
			b.end(0)
		} else {
			_ = b.Close()
		}
		left := r.Len()
		if n, err := b.Read(make([]byte, 8)); n != 0 || !errors.Is(err, http.ErrBodyReadAfterClose) || r.Len() != left {
			t.Errorf("read after %s: %d, %v; the reader went from %d to %d bytes", seal, n, err, left, r.Len())
		}
	}
}

// readerConn is a net.Conn whose reads come from r.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// A head is read with a budget of N bytes: no read returns more than is left, what was
// read is spent, and a spent budget is the head's end (io.EOF), so that a head that
// does not end within its bound fails instead of growing. Bytes the watch read ahead
// come first, once.
func TestClientReaderHeadBudget(t *testing.T) {
	r := &clientReader{c: readerConn{r: strings.NewReader("defghijkl")}, N: 6, pre: []byte("abc")}
	var got []byte
	buf := make([]byte, 16)
	for range 4 {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			if !errors.Is(err, io.EOF) || len(got) != 6 {
				t.Fatalf("read %q then %v, want 6 bytes then io.EOF", got, err)
			}
			break
		}
	}
	if string(got) != "abcdef" || r.N != 0 {
		t.Fatalf("read %q with %d left, want abcdef with 0", got, r.N)
	}
	if n, err := r.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read past the budget: %d, %v; want 0, io.EOF", n, err)
	}
}

// blockingReader blocks a read until release closes, saying when one began.
type blockingReader struct{ started, release chan struct{} }

func (r *blockingReader) Read([]byte) (int, error) {
	close(r.started)
	<-r.release
	return 0, io.EOF
}

func (r *blockingReader) Close() error { return nil }

// done never waits, and a read in progress means the body has not ended.
func TestRequestBodyNotDoneWhileRead(t *testing.T) {
	rc := &blockingReader{started: make(chan struct{}), release: make(chan struct{})}
	b := &requestBody{rc: rc}
	read := make(chan struct{})
	go func() { defer close(read); _, _ = b.Read(make([]byte, 1)) }()
	<-rc.started
	done := b.done()
	close(rc.release)
	<-read
	if done {
		t.Fatal("done while a read was in progress")
	}
	if !b.done() {
		t.Fatal("not done after the read met the body's end")
	}
}

// A deadline the front set to end a body (stopBody) is obeyed: a read fails once it
// passes, and the idle bound does not move it on.
func TestStopBodyIsObeyed(t *testing.T) {
	c, peer := net.Pipe()
	defer peer.Close()
	defer c.Close()
	// The idle bound is an hour and due: a read would set it, were the front's deadline
	// not obeyed.
	r := &clientReader{c: c, N: 1 << 20, body: connio.NewIdleDeadline(c, false, time.Hour)}
	r.stopBody(time.Now())
	read := make(chan error, 1)
	go func() { _, err := r.Read(make([]byte, 8)); read <- err }()
	select {
	case err := <-read:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after stopBody: %v, want the deadline's error", err)
		}
	case <-time.After(hangGuard):
		c.Close() // ends the read
		t.Fatal("a read went on past the front's deadline")
	}
	if r.bodyIdle() {
		t.Fatal("a body the front stopped counted as idle")
	}
}

// endBody ends the bound: the next request's body starts with neither the last one's
// idle mark nor its stop.
func TestEndBodyResets(t *testing.T) {
	c, peer := net.Pipe()
	defer peer.Close()
	defer c.Close()
	r := &clientReader{c: c, N: 1 << 20}
	r.startBody(time.Hour)
	r.idled.Store(true)
	r.stopBody(time.Now().Add(time.Hour))
	r.endBody()
	if r.bodyIdle() || r.stopped || r.body.Timeout() != 0 {
		t.Fatalf("after endBody: idle %v, stopped %v, timeout %v", r.bodyIdle(), r.stopped, r.body.Timeout())
	}
}
