package connio

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// relayBufSize is the read size of a relay before it moves to splice: a read that
// fills it means bulk data is flowing.
const relayBufSize = 16 << 10

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// Direction is one direction of a tunnel: it copies src to dst, pre first. Its copy
// runs on a goroutine of its own for the tunnel's life, and the two goroutines' stacks
// are most of an idle tunnel's memory. The deepest moment of a copy fits Go's 2 KiB
// starting stack with about 200 bytes to spare (measured with Go 1.26, docs/bench.md);
// a goroutine that outgrows it keeps a 4 KiB stack until a garbage collection shrinks
// it, and a proxy that does little else may not collect for a long time. So the
// copy's state lives here rather than in its frames, and the calls below copy take
// few arguments.
type Direction struct {
	dst, src net.Conn
	pre      []byte // what the client sent along with the CONNECT, for the upward one
	n        int64  // bytes written to dst; final once copy returns
	// Both ends' *net.TCPConn, or nil when either end is another kind of connection.
	tcpDst, tcpSrc *net.TCPConn
	// hello, until it has decided, holds the client's first bytes (see Gate).
	hello Gate
}

// NewDirection is the direction that copies src to dst, pre first.
func NewDirection(dst, src net.Conn, pre []byte) Direction {
	d := Direction{dst: dst, src: src, pre: pre}
	td, dok := dst.(*net.TCPConn)
	ts, sok := src.(*net.TCPConn)
	if dok && sok {
		d.tcpDst, d.tcpSrc = td, ts
	}
	return d
}

// Copy relays until EOF (nil error) or an error; clock ends it when both directions
// stay idle (see IdleClock). Between two *net.TCPConn it starts with plain reads and
// writes through a pooled buffer that it holds only while bytes move (it waits for
// input in the poller with no buffer), and moves to splice (TCPConn.ReadFrom, no copy
// through user space) once a read fills the buffer. Short exchanges (TLS handshakes,
// requests and answers, tunnel set-ups) so need no pipe: splice takes a pipe pair per
// direction, kept while the direction waits, and the pipes' set-up and teardown were a
// tenth of the proxy's CPU per tunnel set-up. Kept out of line so an idle direction's
// stack stays at its smallest size.
//
//go:noinline
func (d *Direction) Copy(clock *IdleClock) error {
	var err error
	if len(d.pre) > 0 {
		var p []byte
		if p, err = d.pass(d.pre); len(p) > 0 {
			var w int
			w, err = d.dst.Write(p)
			d.n += int64(w)
		}
		d.pre = nil
	}
	bulk := false
	for err == nil {
		clock.arm(d.src)
		var m int64
		switch {
		case d.tcpDst == nil:
			m, err = io.Copy(d.dst, d.src)
		case bulk:
			m, err = d.tcpDst.ReadFrom(d.tcpSrc)
		default:
			m, err = d.copyUntilBulk()
		}
		d.n += m
		if m > 0 && err != nil {
			clock.touch()
		}
		if err == errBufferFilled {
			bulk, err = true, nil
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if !clock.idle() {
			err = nil // a period ended with traffic somewhere: go on
		}
	}
	return err
}

// errBufferFilled ends copyUntilBulk: a read filled the buffer, bulk data is flowing.
var errBufferFilled = errors.New("relay buffer filled")

// copyUntilBulk relays with read and write until EOF (nil error), an error, or a read
// that fills the buffer (errBufferFilled).
func (d *Direction) copyUntilBulk() (n int64, err error) {
	rc, err := d.tcpSrc.SyscallConn()
	if err != nil {
		return 0, err
	}
	for {
		var (
			buf  *[]byte
			nr   int
			rerr error
		)
		err = rc.Read(func(fd uintptr) bool {
			buf = relayBufs.Get().(*[]byte)
			for {
				nr, rerr = syscall.Read(int(fd), *buf)
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				relayBufs.Put(buf)
				return false // wait until readable
			}
			return true
		})
		if err != nil {
			return n, err // the deadline, or the connection closed
		}
		if rerr != nil {
			relayBufs.Put(buf)
			return n, os.NewSyscallError("read", rerr)
		}
		if nr <= 0 {
			relayBufs.Put(buf)
			return n, nil
		}
		p, gerr := d.pass((*buf)[:nr])
		if gerr != nil {
			relayBufs.Put(buf)
			return n, gerr
		}
		var werr error
		if len(p) > 0 { // none while a gate holds an incomplete hello
			var w int
			w, werr = d.tcpDst.Write(p)
			n += int64(w)
		}
		relayBufs.Put(buf)
		if werr != nil {
			return n, werr
		}
		// Splice moves bytes no gate sees: a gate holding a hello reads on.
		if nr == relayBufSize && d.hello == nil {
			return n, errBufferFilled
		}
	}
}

// pass returns what of p, the next bytes read, may go to dst now: all of it once the
// direction has no gate, or when its gate skips them (a check that needs no stack). Otherwise the gate runs on a goroutine of its own, which ends with it:
// reading a hello and deciding its name outgrows the relay's 2 KiB stack (stacks 4 KiB
// larger per tunnel, 8 with a decision line, measured with Go 1.26), which the relay's
// goroutine would otherwise keep until a collection (see Direction). A panic there is
// raised again here, for recoverRelay.
func (d *Direction) pass(p []byte) ([]byte, error) {
	if d.hello == nil {
		return p, nil
	}
	if d.hello.Skips(p) {
		d.hello = nil
		return p, nil
	}
	r := &gateRun{g: d.hello, in: p, finished: make(chan struct{})}
	go r.run()
	<-r.finished
	if r.panicked != nil {
		panic(r.panicked)
	}
	if r.done {
		d.hello = nil
	}
	return r.out, r.err
}

// gateRun is one feed of a gate, on the goroutine pass starts.
type gateRun struct {
	g        Gate
	in, out  []byte
	done     bool
	err      error
	panicked any
	finished chan struct{}
}

func (r *gateRun) run() {
	defer close(r.finished)
	defer func() { r.panicked = recover() }()
	r.out, r.done, r.err = r.g.Feed(r.in)
}

// HalfCloser is what *net.TCPConn offers for a clean one-way EOF.
type HalfCloser interface {
	CloseWrite() error
}

// End ends the direction after its copy returned err: on EOF (nil) it passes the EOF
// on (half-close) so the other direction keeps flowing; on an error it closes both
// ends, which also stops the other direction's copy. src has already said EOF, so
// shutting its read side too would only cost a system call per tunnel; and when the
// other direction has ended too (last), the tunnel closes both sockets next, which
// passes the EOF on by itself.
func (d *Direction) End(err error, last bool) {
	if h, ok := d.dst.(HalfCloser); ok && err == nil {
		if !last {
			_ = h.CloseWrite()
		}
		return
	}
	d.dst.Close()
	d.src.Close()
}

// SetGate makes g hold the direction's first bytes until it has decided; both ends
// must be TCP (TCP), as only the copy between them runs a gate.
func (d *Direction) SetGate(g Gate) { d.hello = g }

// TCP reports whether both ends are *net.TCPConn, between which the copy splices.
func (d *Direction) TCP() bool { return d.tcpDst != nil }

// Dst and Src are the direction's ends.
func (d *Direction) Dst() net.Conn { return d.dst }

func (d *Direction) Src() net.Conn { return d.src }

// Moved is what the direction wrote to dst; final once Copy returned.
func (d *Direction) Moved() int64 { return d.n }

// Close closes both ends, which ends the copies of both directions of the tunnel.
func (d *Direction) Close() {
	d.src.Close()
	d.dst.Close()
}
