package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// front serves the proxy's client connections: it reads each request head with
// net/http's parser, serves a CONNECT itself (a tunnel needs nothing more), and hands
// every other request to goproxy with a lean response writer. It replaces net/http's
// server for this listener: the server's per-connection and per-request machinery
// (contexts, background reads, its response writer) was the largest share of the
// proxy's own CPU per tunnel set-up and per forwarded request, and it drops the Host
// field of absolute-form requests before a handler can compare it with the URI.
type front struct {
	s    *Server
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

func newFront(s *Server) *front {
	return &front{s: s, done: make(chan struct{}), conns: make(map[net.Conn]*connState), work: make(chan net.Conn)}
}

// maxHeadBytes bounds a request head (what net/http's server allows with our
// MaxHeaderBytes of 64 KiB, including its 4 KiB of slack).
const maxHeadBytes = 64<<10 + 4096

// maxHeadFields bounds the field lines of a head, a request's or an upstream's answer's
// (Apache and HAProxy allow about 100). Parsed, a head of tiny fields costs about
// thirty times its size, held while its request is served: 64 KiB of them took some
// 1 MiB of heap, a 10 MiB answer head of them 280 MiB.
const maxHeadFields = 256

var errTooManyFields = fmt.Errorf("%w: more than %d field lines", errHeadTooLong, maxHeadFields)

// maxDrainBytes is how much of a request body nobody read is discarded to keep the
// connection for another request; a longer rest closes it instead.
const maxDrainBytes = 256 << 10

// frontReaders are the connections' 4 KiB readers; a head that does not fit gets a
// reader of its own (see hostFields).
var frontReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// Accept failures other than a closed listener (EMFILE, ENFILE, ENOBUFS) pass when
// connections end: the front waits, from acceptRetryMin doubling to acceptRetryMax,
// and accepts again, rather than stop serving the sandbox for the rest of its task.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// serve accepts until the listener closes.
func (f *front) serve() error {
	defer close(f.work) // serve alone sends on it; its end lets the waiting workers end
	var retry time.Duration
	for {
		c, err := f.s.proxyLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				f.Close()
				return err
			}
			retry = min(max(2*retry, acceptRetryMin), acceptRetryMax)
			f.s.log.Warn("accept failed", "error", err.Error(), "retry_seconds", retry.Seconds())
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
		if !f.track(c) {
			c.Close()
			f.s.proxyLn.Release()
			continue
		}
		f.dispatch(c)
	}
}

// maxIdleWorkers bounds the workers that wait for a connection; the others end with
// theirs.
const maxIdleWorkers = 16

// dispatch hands c to a worker that waits for one, or to a new worker.
func (f *front) dispatch(c net.Conn) {
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
func (f *front) worker(c net.Conn) {
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
func (f *front) track(c net.Conn) bool {
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
func (f *front) waiting(c net.Conn, cancel context.CancelFunc) bool {
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
func (f *front) cancelRequest(c net.Conn) {
	f.mu.Lock()
	st := f.conns[c]
	f.mu.Unlock()
	if st != nil {
		st.cancel()
	}
}

func (f *front) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	f.wg.Done()
}

func (f *front) draining() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// Close begins the drain: no new connections, and every connection waiting for a head
// is woken (its read deadline passes) to close; connections in a request close after
// their response.
func (f *front) Close() {
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

// wait returns when every connection has ended, or when ctx ends; then it closes the
// connections still open and waits for their goroutines.
func (f *front) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	f.mu.Lock()
	for c, st := range f.conns {
		c.Close()
		st.cancel()
	}
	f.mu.Unlock()
	<-done
}

// clientWatchDelay is how long a request without a body waits for the end of its answer
// before the front starts watching its client: a request answered sooner never pays the
// watch's system calls.
const clientWatchDelay = time.Second

// clientConn is one client connection's reading state, and the writer of its answers.
type clientConn struct {
	c      net.Conn
	in     *clientReader // the socket, limited while a head is read, bounded while a body is
	br     *bufio.Reader
	remote string
	out    connio.IdleWriter // c, for answers to forwarded requests
	gone   connio.GoneWatch  // c, while a request without a body is served
	typ    string            // the type of the request being served, for a panic's log line
	origin netip.AddrPort    // a transparent connection's original destination (see serveOrigin)
}

// serveOrigin serves c, a transparent connection to origin, on the caller's goroutine:
// each of its requests is decided on its Host and sent to origin alone (verdictHTTP).
func (f *front) serveOrigin(c net.Conn, origin netip.AddrPort) {
	if !f.track(c) {
		f.closeAnswered(c)
		return
	}
	f.serveConn(c, origin)
}

func (f *front) serveConn(c net.Conn, origin netip.AddrPort) {
	defer f.untrack(c)
	cc := &clientConn{c: c, in: &clientReader{c: c, N: math.MaxInt64}, remote: c.RemoteAddr().String(), origin: origin,
		out: connio.NewIdleWriter(c, f.s.cfg.TunnelIdleTimeout, connio.ErrClientIdle)}
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
func (f *front) endConn(cc *clientConn, owned *bool) {
	p := recover()
	if p != nil {
		f.s.recovered(componentFront, cc.typ, cc.remote, p)
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
func (f *front) awaitHead(cc *clientConn, first bool) bool {
	c := cc.c
	cc.typ = "" // not known until a head is read
	if cc.br.Size() > 4096 && cc.br.Buffered() == 0 {
		// The long head that needed a reader of its own is served and nothing
		// follows it yet: the connection waits with 4 KiB, not 68, so idle
		// connections cannot pin 68 KiB each.
		cc.br = frontReaders.Get().(*bufio.Reader)
		cc.br.Reset(cc.in)
	}
	wait := f.s.cfg.IdleTimeout
	if first {
		wait = f.s.cfg.HeaderTimeout
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
func (f *front) serveHead(cc *clientConn, first bool) (keep, handedOver bool) {
	c := cc.c
	if !first {
		_ = c.SetReadDeadline(time.Now().Add(f.s.cfg.HeaderTimeout))
	}
	cc.in.N = maxHeadBytes - int64(cc.br.Buffered())
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
		typ := typeHTTP
		if req.Method == http.MethodConnect {
			typ = typeConnect
		}
		f.refuseMalformed(cc, typ, ReasonMalformedRequest, req.Host, answer)
		return false, false
	}
	if req.Method == http.MethodConnect {
		cc.typ = typeConnect
		return false, f.connect(ctx, cancel, cc, req)
	}
	cc.typ = typeHTTP
	keep, hijacked := f.serveRequest(ctx, cc, req, cancel, fields.hosts)
	if hijacked {
		cc.br = nil
	}
	return keep, hijacked
}

// refuseHead answers a head that could not be read: 503 when the drain interrupted it,
// 431 when it was too long, 400 when it was malformed; a client that went away or
// stalled gets nothing.
func (f *front) refuseHead(cc *clientConn, err error, drain, tooLong bool) {
	switch {
	case drain:
		f.answer(cc.c, drainingAnswer)
	case tooLong:
		f.refuseMalformed(cc, typeHTTP, ReasonHeadTooLong, "", plainAnswer("431 Request Header Fields Too Large"))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
	default:
		f.refuseMalformed(cc, typeHTTP, ReasonMalformedRequest, "", plainAnswer("400 Bad Request"))
	}
}

// refuseMalformed answers a head the proxy will not serve and counts and logs the
// refusal as a decision: there is no destination to decide on (nor to list in
// /v1/blocked), but an operator sees who sent what (a desync attempt, say). host is
// what the head named, if it could be read.
func (f *front) refuseMalformed(cc *clientConn, typ, reason, host, answer string) {
	f.answer(cc.c, answer)
	s := f.s
	s.metrics.requests.WithLabelValues(typ, "denied", reason).Inc()
	s.logDecision(s.current.Load(), typ, "denied", reason, "", host, 0, netip.Addr{}, cc.remote)
}

// errorAnswer is the proxy's own failure (not a policy refusal): an empty answer whose
// X-Compass-Egress header names the reason, after which the connection closes.
func errorAnswer(status, reason string) string {
	return "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nX-Compass-Egress: error; reason=" +
		reason + "\r\nContent-Length: 0\r\n\r\n"
}

var drainingAnswer = errorAnswer("503 Service Unavailable", "draining")

// sentInput reports whether the client has sent bytes the connection has not read
// (the drain's wake-up can stop a read before it looks). What a client has sent over
// loopback or a bridge is in the socket by the time it matters, so a short look is
// enough.
func (cc *clientConn) sentInput() bool {
	_ = cc.c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := cc.br.Peek(1)
	return err == nil
}

func plainAnswer(status string) string {
	return "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		fmt.Sprint(len(status)) + "\r\n\r\n" + status
}

// checkRequest refuses what net/http's server refuses in a parsed request, and heads a
// server behind the proxy could frame or route otherwise than the proxy does; ""
// passes.
func checkRequest(r *http.Request, raw rawFields) string {
	if r.ProtoMajor != 1 {
		return plainAnswer("505 HTTP Version Not Supported")
	}
	if r.ProtoAtLeast(1, 1) && len(raw.hosts) == 0 && r.Method != http.MethodConnect {
		return plainAnswer("400 Bad Request: missing required Host header")
	}
	for name, values := range r.Header {
		if !httpguts.ValidHeaderFieldName(name) {
			return plainAnswer("400 Bad Request: header field name " + quoteField(name) + " is not a token (RFC 9110, 5.1)")
		}
		// Servers that map header names to CGI-style variables read _ as -.
		if dashed := strings.ReplaceAll(name, "_", "-"); dashed != name && framingField(dashed) {
			return plainAnswer("400 Bad Request: header field name " + quoteField(name) + " reads as " +
				http.CanonicalHeaderKey(dashed) + " to a server that takes _ for -")
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return plainAnswer("400 Bad Request: header field " + quoteField(name) + " has a control character in its value")
			}
		}
	}
	if len(r.TransferEncoding) > 0 && raw.contentLength {
		// net/http's parser drops the Content-Length; a server behind the proxy may not.
		return plainAnswer("400 Bad Request: Content-Length with Transfer-Encoding (RFC 9112, 6.1)")
	}
	if r.Header.Get("Upgrade") != "" && r.ContentLength != 0 {
		// The connection changes hands at the 101: a body still being copied upstream
		// would read the new protocol's bytes.
		return plainAnswer("400 Bad Request: an upgrade request carries no body")
	}
	return ""
}

// framingField reports whether name (any case) is a field that frames a request,
// routes it or changes its connection.
func framingField(name string) bool {
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "connection", "upgrade", "trailer", "te":
		return true
	}
	return false
}

// quoteField quotes a client's field name for an answer, cut to a length that keeps
// the status line short.
func quoteField(name string) string {
	const max = 64
	if len(name) > max {
		return strconv.Quote(name[:max]) + "..."
	}
	return strconv.Quote(name)
}

// answer writes a last answer; the connection closes after it.
func (f *front) answer(c net.Conn, answer string) {
	_ = c.SetWriteDeadline(time.Now().Add(f.s.cfg.HeaderTimeout))
	_, _ = io.WriteString(c, answer)
}

// lingerTime bounds how long closeAnswered waits for a client to stop sending.
const lingerTime = 500 * time.Millisecond

// closeAnswered closes a connection after its last answer and gives its slot back.
// Closing a socket with unread input makes the kernel send a reset, which can destroy
// the answer before the client reads it; so it first ends its own side and reads what
// the client still sends, for a bounded time and amount, as net/http's server does.
func (f *front) closeAnswered(c net.Conn) {
	if hc, ok := c.(connio.HalfCloser); ok && hc.CloseWrite() == nil {
		_ = c.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.CopyN(io.Discard, c, maxDrainBytes)
	}
	c.Close()
	f.s.proxyLn.Release()
}

// connect serves a CONNECT: decided, refused or tunnelled. ctx is the request's context
// (cancel ends it), passed on its own because attaching it to req would copy the
// request. It reports whether the tunnel took the connection.
func (f *front) connect(ctx context.Context, cancel context.CancelFunc, cc *clientConn, req *http.Request) bool {
	var buffered []byte
	if n := cc.br.Buffered(); n > 0 {
		b, _ := cc.br.Peek(n)
		buffered = append([]byte(nil), b...)
	}
	s := f.s
	rs := s.current.Load()
	var v Verdict
	// These refusals are logged and counted under the target as written: net/http's
	// reading of it (the host after an @, before a path, decoded) can be an allowed
	// name while the rest names the destination the client was after.
	switch {
	case req.URL.User != nil:
		// net/http reads "CONNECT u@host:port" as host:port with userinfo; the
		// authority form has none (RFC 9110, 9.3.6).
		v = Verdict{Host: asWritten(req.RequestURI), Reason: ReasonUserinfo}
		s.record(rs, typeConnect, v, req.RemoteAddr)
	case req.RequestURI != req.URL.Host:
		// Nor a path, a query or a percent-encoded host, which net/http drops or
		// decodes: the target must be the authority the decision reads, as written.
		v = Verdict{Host: asWritten(req.RequestURI), Reason: ReasonInvalidHost}
		s.record(rs, typeConnect, v, req.RemoteAddr)
	default:
		v = s.decideTunnel(ctx, rs, req.URL.Host, req.RemoteAddr)
	}
	if !v.Allowed {
		_ = cc.c.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
		_ = refusalResponse(req, s.decidedBy(rs, v), typeConnect, v).Write(cc.c)
		return false
	}
	rearm := func(end context.CancelFunc) { f.waiting(cc.c, end) }
	return s.openTunnel(ctx, cancel, rearm, req, cc.out.HandOver(), buffered, rs, v)
}

// serveRequest runs goproxy on one request and finishes its response. keep says the
// connection may carry another request; hijacked that goproxy took it over.
func (f *front) serveRequest(ctx context.Context, cc *clientConn, req *http.Request, cancel context.CancelFunc, hosts []string) (keep, hijacked bool) {
	// A request that asked for an upgrade ends its connection unless it was upgraded:
	// what the client sent after it may be meant for the upgraded protocol.
	closeAfter := req.Close || !req.ProtoAtLeast(1, 1) || f.draining() || req.Header.Get("Upgrade") != ""
	w := newResponseWriter(&cc.out, cc.br, req, closeAfter)
	st := f.newRequestState(ctx, cc, req, w, cancel, hosts)
	// The watch reads the connection, so not while a body or an upgrade may; nor
	// behind a next request already read, which says the client is there and whose
	// connection's end belongs to that request.
	watch := st.body == nil && req.Header.Get("Upgrade") == "" && cc.br.Buffered() == 0
	if watch {
		cc.gone.Arm(cc.c, st.client, f.s.cfg.clientWatchDelay, &st.clientLeft)
	}
	req = req.WithContext(withState(ctx, st))
	panicked := f.runProxy(w, req, st, cc.remote)
	if watch {
		cc.in.pre = cc.gone.Stop()
	}
	left := st.clientLeft.Load()
	if left && st.entry != nil {
		f.s.log.Info("client gone", "type", typeHTTP, "host", st.entry.name, "port", st.entry.port, "client", cc.remote)
	}
	// A connection handed over is the relay's, which settle closed if goproxy
	// panicked; one a panic stopped between the hand-over and the relay is nobody's,
	// and closes here.
	if w.hijacked && (!panicked || st.relay != nil) {
		return false, true
	}
	keep = f.finishAnswer(cc, w, st, panicked, left)
	if st.body == nil {
		return keep, false
	}
	return f.endBody(cc, st.body, keep), false
}

// newRequestState is the state of req, a request of cc's that w answers, which cancel
// cuts; hosts are its Host fields as sent. A request with a body has it read under the
// idle bound.
func (f *front) newRequestState(ctx context.Context, cc *clientConn, req *http.Request, w *responseWriter, cancel context.CancelFunc, hosts []string) *requestState {
	// A request without a body keeps http.NoBody: anything else makes the transport
	// probe for a body on a goroutine of its own.
	var body *requestBody
	if req.Body != http.NoBody {
		cc.in.startBody(f.s.cfg.TunnelIdleTimeout)
		body = newRequestBody(req)
		if req.ProtoAtLeast(1, 1) && hasToken(req.Header.Get("Expect"), "100-continue") {
			body.beforeRead = w.sendContinue
		}
		req.Body = body
	}
	st := &requestState{client: &requestClient{s: f.s, conn: cc.c, cancel: cancel}, ctx: ctx, body: body, origin: cc.origin}
	if body != nil {
		st.head.OnConnEnd = func() {
			if !body.done() {
				cc.in.stopBody(time.Now())
			}
		}
	}
	if len(hosts) > 0 {
		st.host = hostField{value: hosts[0], present: true}
	}
	return st
}

// runProxy runs goproxy on req and reports whether it panicked, which it recovers.
func (f *front) runProxy(w *responseWriter, req *http.Request, st *requestState, client string) (panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			f.s.recovered(componentFront, typeHTTP, client, p)
			panicked = true
		}
	}()
	f.s.serveProxy(w, req, st)
	return false
}

// finishAnswer ends the answer w wrote to st's request, which goproxy served (unless
// it panicked) and whose client may have left, and reports whether the connection may
// carry another request.
func (f *front) finishAnswer(cc *clientConn, w *responseWriter, st *requestState, panicked, left bool) (keep bool) {
	if panicked {
		// Nothing of a response has gone out, not even part of a head: the client
		// is told the proxy failed, in an answer no destination sends.
		w.replaceUnsent(errorAnswer("500 Internal Server Error", "internal-error"))
	}
	// The head of an answer is held until its body's first bytes: one whose body broke
	// off before any (the upstream closed right after its head) has sent the client
	// nothing, which is still the proxy's to answer rather than leave it a bare close.
	if st.answerErr != nil {
		status, reason := "502 Bad Gateway", "upstream-failed"
		if errors.Is(st.answerErr, connio.ErrUpstreamIdle) {
			status, reason = "504 Gateway Timeout", "upstream-timeout"
		}
		if w.replaceUnsent(errorAnswer(status, reason)) && reason == "upstream-failed" && st.entry != nil {
			f.s.log.Warn("upstream failed", "type", typeHTTP, "host", st.entry.name, "port", st.entry.port, "client", cc.remote, "error", clipError(st.answerErr))
		}
	}
	// An answer whose upstream body broke off ends with the connection, never with
	// the framing of a whole one (a last chunk, a kept connection); so does a request
	// whose client stopped sending its body, unanswered.
	bodyIdle := st.body != nil && cc.in.bodyIdle()
	keep = !panicked && !left && st.answerErr == nil && !bodyIdle && w.finish()
	if !keep {
		switch {
		case bodyIdle:
			f.s.logIdle(st, "request body idle", cc.remote, "client")
		case errors.Is(st.answerErr, connio.ErrUpstreamIdle):
			f.s.logIdle(st, "answer idle", cc.remote, "upstream")
		case errors.Is(w.writeErr(), connio.ErrClientIdle):
			f.s.logIdle(st, "answer idle", cc.remote, "client")
		}
	}
	return keep
}

// endBody ends the request body of cc's request and reports whether the connection
// may carry another request (keep, and the body read to its end). The body reads the
// connection's reader, which the next request (or the pool) gets next: it is ended
// first. A transport goroutine may be in a read of it; the deadline bounds that read,
// and the discard of what nobody read.
func (f *front) endBody(cc *clientConn, body *requestBody, keep bool) bool {
	defer cc.in.endBody()
	if keep {
		if !body.done() {
			cc.in.stopBody(time.Now().Add(lingerTime))
		}
		return body.end(maxDrainBytes)
	}
	cc.in.stopBody(time.Now())
	body.end(0)
	return false
}

func hasToken(v, token string) bool {
	for _, f := range strings.Split(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// hostField is a request's raw Host field.
type hostField struct {
	value   string
	present bool
}

var errHeadTooLong = errors.New("proxy: request head too long")

// rawFields are the fields of the head about to be read that net/http's parser drops:
// Host for absolute-form requests, Content-Length beside Transfer-Encoding.
type rawFields struct {
	hosts         []string
	contentLength bool
}

// headFields returns the rawFields of the head about to be read. It peeks without
// consuming; a head longer than the connection's reader moves the connection to a
// reader that fits the longest head allowed.
func (cc *clientConn) headFields() (rawFields, error) {
	for {
		buf, _ := cc.br.Peek(cc.br.Buffered())
		if end := headEnd(buf); end >= 0 {
			// Every line but the request line and the empty one; a folded line counts too.
			if bytes.Count(buf[:end], []byte("\n"))-2 > maxHeadFields {
				return rawFields{}, errTooManyFields
			}
			return rawFields{
				hosts:         scanField(buf[:end], "host"),
				contentLength: scanField(buf[:end], "content-length") != nil,
			}, nil
		}
		if len(buf) == cc.br.Size() {
			if cc.br.Size() >= maxHeadBytes {
				return rawFields{}, errHeadTooLong
			}
			rest := append([]byte(nil), buf...)
			old := cc.br
			cc.br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(rest), cc.in), maxHeadBytes)
			old.Reset(nil)
			frontReaders.Put(old)
			continue
		}
		if _, err := cc.br.Peek(len(buf) + 1); err != nil {
			// The parser meets the same end and reports it.
			return rawFields{}, nil
		}
	}
}

// headEnd is the length of the head at the start of buf (through its empty line), or -1.
func headEnd(buf []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			return -1
		}
		line := buf[i : i+j]
		i += j + 1
		if len(line) == 0 || len(line) == 1 && line[0] == '\r' {
			return i
		}
	}
}

// scanField returns the values of the fields of a head named name (in lower case),
// read as net/textproto reads them: a line that starts with a space or a tab continues
// the field before it (obsolete line folding), each line trimmed and joined with one
// space.
func scanField(head []byte, name string) []string {
	var values []string
	_, rest, _ := bytes.Cut(head, []byte("\n")) // the request line
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if len(line) <= len(name) || line[len(name)] != ':' || !bytes.EqualFold(line[:len(name)], []byte(name)) {
			continue
		}
		value := string(trimLine(line)[len(name)+1:])
		for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
			line, rest, _ = bytes.Cut(rest, []byte("\n"))
			value += " " + string(trimLine(line))
		}
		values = append(values, strings.TrimLeft(value, " \t"))
	}
	return values
}

// trimLine is a head's line as net/textproto trims it: without its CR, then without
// the spaces and tabs at either end.
func trimLine(line []byte) []byte {
	return bytes.Trim(bytes.TrimSuffix(line, []byte("\r")), " \t")
}
