package httpfront

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// clientConn is one client connection's reading state, and the writer of its answers.
type clientConn struct {
	c      net.Conn
	in     *clientReader // the socket, limited while a head is read, bounded while a body is
	br     *bufio.Reader
	remote string
	out    connio.IdleWriter // c, for answers to forwarded requests
	gone   connio.GoneWatch  // c, while a request without a body is served
	typ    string            // the type of the request being served, for a panic's log line
	origin netip.AddrPort    // a transparent connection's original destination (see ServeOrigin)
}

// ServeOrigin serves c, a transparent connection to origin that holds a slot of the
// listener, on the caller's goroutine: each of its requests reaches the Handler with
// Origin set, to be decided on its own Host and sent to origin alone.
func (f *Front) ServeOrigin(c net.Conn, origin netip.AddrPort) {
	if !f.track(c) {
		f.closeAnswered(c)
		return
	}
	f.serveConn(c, origin)
}

func (f *Front) serveConn(c net.Conn, origin netip.AddrPort) {
	defer f.untrack(c)
	cc := &clientConn{c: c, in: &clientReader{c: c, N: math.MaxInt64}, remote: c.RemoteAddr().String(), origin: origin,
		out: connio.NewIdleWriter(c, f.cfg.TunnelIdleTimeout, connio.ErrClientIdle)}
	cc.br = frontReaders.Get().(*bufio.Reader)
	cc.br.Reset(cc.in)
	owned := false // a tunnel or hijacker took the connection
	defer f.endConn(cc, &owned)
	for first := true; ; first = false {
		if !f.awaitHead(cc, first) {
			return
		}
		keep, handedOver := f.serveHead(cc, first)
		if handedOver {
			owned = true
			return
		}
		if !keep || f.draining() {
			return
		}
	}
}

// endConn ends cc's connection, unless owned: a tunnel or hijacker took it. A panic
// ends this connection alone (net/http's server does the same). It is closed, never
// answered: part of an answer, or a CONNECT's 200, may have gone out, after which any
// bytes of the proxy's own would read as the destination's. What it held is released
// as on any other end: the slot here, its tracked entries and counts by the deferred
// releases that panicked through them; its request's context is ended.
func (f *Front) endConn(cc *clientConn, owned *bool) {
	p := recover()
	if p != nil {
		f.h.Recovered(cc.typ, cc.remote, p)
		f.cancelRequest(cc.c)
	}
	if !*owned {
		f.closeAnswered(cc.c)
	}
	// After a panic the reader may still be in use (a body a transport goroutine
	// reads): it is left to the collector rather than shared.
	if p == nil && cc.br != nil && cc.br.Size() == 4096 {
		cc.br.Reset(nil)
		frontReaders.Put(cc.br)
	}
}

// awaitHead waits for the first byte of cc's next head (the first one, if first) and
// reports whether one came.
func (f *Front) awaitHead(cc *clientConn, first bool) bool {
	c := cc.c
	cc.typ = "" // not known until a head is read
	if cc.br.Size() > 4096 && cc.br.Buffered() == 0 {
		// The long head that needed a reader of its own is served and nothing
		// follows it yet: the connection waits with 4 KiB, not 68, so idle
		// connections cannot pin 68 KiB each.
		cc.br = frontReaders.Get().(*bufio.Reader)
		cc.br.Reset(cc.in)
	}
	wait := f.cfg.IdleTimeout
	if first {
		wait = f.cfg.HeaderTimeout
	}
	// The deadline comes first: once marked waiting, the drain may move it to now.
	_ = c.SetReadDeadline(time.Now().Add(wait))
	err := net.ErrClosed // the drain has begun
	if f.waiting(c, nil) {
		_, err = cc.br.Peek(1)
	}
	if err != nil {
		// Closed, idle too long, or stopped by the drain. A client that had
		// sent the start of a request is told why it goes unserved.
		if f.draining() && cc.sentInput() {
			f.answer(c, drainingAnswer)
		}
		return false
	}
	return true
}

// serveHead reads the head that has begun on cc and serves its request. keep says the
// connection may carry another request; handedOver that a tunnel or hijacker took it.
func (f *Front) serveHead(cc *clientConn, first bool) (keep, handedOver bool) {
	c := cc.c
	if !first {
		_ = c.SetReadDeadline(time.Now().Add(f.cfg.HeaderTimeout))
	}
	cc.in.N = MaxHeadBytes - int64(cc.br.Buffered())
	fields, err := cc.headFields()
	var req *http.Request
	if err == nil {
		req, err = http.ReadRequest(cc.br)
	}
	// Each request has a context of its own, not one derived from the
	// connection's: a child context costs a registration with its parent per
	// request. The drain reaches it through the connection's state.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drain := !f.waiting(c, cancel)
	tooLong := cc.in.N <= 0 || errors.Is(err, errHeadTooLong)
	cc.in.N = math.MaxInt64
	if err != nil {
		cancel()
		f.refuseHead(cc, err, drain, tooLong)
		return false, false
	}
	// The head's deadline stays while nothing reads the connection (the next
	// wait sets its own); a tunnel or an upgrade reads it without one, a body
	// under the idle bound (serveRequest).
	if req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
		_ = c.SetReadDeadline(time.Time{})
	}
	req.RemoteAddr = cc.remote
	if answer := checkRequest(req, fields); answer != "" {
		cancel()
		typ := TypeHTTP
		if req.Method == http.MethodConnect {
			typ = TypeConnect
		}
		f.refuseMalformed(cc, typ, ReasonMalformedRequest, req.Host, answer)
		return false, false
	}
	r := &Request{Ctx: ctx, Cancel: cancel, Conn: c, Client: cc.remote, Origin: cc.origin, f: f, cc: cc}
	if len(fields.hosts) > 0 {
		r.Host, r.HostSent = fields.hosts[0], true
	}
	if req.Method == http.MethodConnect {
		cc.typ = TypeConnect
		return false, f.connect(cc, r, req)
	}
	cc.typ = TypeHTTP
	keep, hijacked := f.serveRequest(cc, r, req)
	if hijacked {
		cc.br = nil
	}
	return keep, hijacked
}

// refuseHead answers a head that could not be read: 503 when the drain interrupted it,
// 431 when it was too long, 400 when it was malformed; a client that went away or
// stalled gets nothing.
func (f *Front) refuseHead(cc *clientConn, err error, drain, tooLong bool) {
	switch {
	case drain:
		f.answer(cc.c, drainingAnswer)
	case tooLong:
		f.refuseMalformed(cc, TypeHTTP, ReasonHeadTooLong, "", plainAnswer("431 Request Header Fields Too Large"))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
	default:
		f.refuseMalformed(cc, TypeHTTP, ReasonMalformedRequest, "", plainAnswer("400 Bad Request"))
	}
}

// refuseMalformed answers a head the proxy will not serve and has the refusal counted
// and logged as a decision: there is no destination to decide on (nor to list in
// /v1/blocked), but an operator sees who sent what (a desync attempt, say). host is
// what the head named, if it could be read.
func (f *Front) refuseMalformed(cc *clientConn, typ, reason, host, answer string) {
	f.answer(cc.c, answer)
	f.h.Refused(typ, reason, host, cc.remote, cc.origin)
}

// sentInput reports whether the client has sent bytes the connection has not read
// (the drain's wake-up can stop a read before it looks). What a client has sent over
// loopback or a bridge is in the socket by the time it matters, so a short look is
// enough.
func (cc *clientConn) sentInput() bool {
	_ = cc.c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := cc.br.Peek(1)
	return err == nil
}

// answer writes a last answer; the connection closes after it.
func (f *Front) answer(c net.Conn, answer string) {
	_ = c.SetWriteDeadline(time.Now().Add(f.cfg.HeaderTimeout))
	_, _ = io.WriteString(c, answer)
}

// LingerTime bounds how long closeAnswered waits for a client to stop sending (and a
// swap's cut for a tunnel's 200 on its way out).
const LingerTime = 500 * time.Millisecond

// closeAnswered closes a connection after its last answer and gives its slot back.
// Closing a socket with unread input makes the kernel send a reset, which can destroy
// the answer before the client reads it; so it first ends its own side and reads what
// the client still sends, for a bounded time and amount, as net/http's server does.
func (f *Front) closeAnswered(c net.Conn) {
	if hc, ok := c.(connio.HalfCloser); ok && hc.CloseWrite() == nil {
		_ = c.SetReadDeadline(time.Now().Add(LingerTime))
		_, _ = io.CopyN(io.Discard, c, maxDrainBytes)
	}
	c.Close()
	f.cfg.Listener.Release()
}

// connect hands a CONNECT to the Handler, with its own copy of the bytes the client
// sent after the head: the reader goes back to the pool once the tunnel has the
// connection. It reports whether the tunnel took the connection.
func (f *Front) connect(cc *clientConn, r *Request, req *http.Request) bool {
	if n := cc.br.Buffered(); n > 0 {
		b, _ := cc.br.Peek(n)
		r.Buffered = append([]byte(nil), b...)
	}
	r.Conn = cc.out.HandOver()
	return f.h.Connect(r, req)
}
