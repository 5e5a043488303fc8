package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/elazarl/goproxy"

	"github.com/compass-egress/compass-egress/proxy/blocked"
	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
	"github.com/compass-egress/compass-egress/proxy/upclient"
)

// requestState travels with one request through goproxy's handler chain.
type requestState struct {
	client *requestClient
	fr     *httpfront.Request // the front's view of the request: its Host field, body, client
	rs     *RuleSet
	// origin is the original destination of the transparent connection the request
	// came on, which alone it may go to (zero: the explicit proxy's).
	origin netip.AddrPort
	// entry is the tracked in-flight HTTP request, if one was allowed.
	entry *liveConn
	// verdict is the allowed request's, which its dial (dialChecked, or the upstream
	// client's) tries address by address and records the address dialled in.
	verdict Verdict
	// ctx is the request's own context, which a swap's cut and the drain end; the
	// Transport dials under one detached from it (see dialChecked).
	ctx context.Context
	// relay is set when goproxy took the connection over (a websocket), at
	// relayStart; relayIdle stops the watch that ends the relay once it idles.
	relay      *connio.IdleConn
	relayStart time.Time
	relayIdle  func()
	up, down   atomic.Int64
	// answerErr is the error that broke off the upstream's answer body: goproxy
	// ignores it, and the front must not end that answer as if it were whole.
	answerErr error
	answer    answerBody       // the answer's body, held here to save an allocation
	head      connio.HeadWatch // the Transport's wait for the answer head
	// refusedConn is set when a swap came between the decision and the upstream
	// connection and the new policy refuses the connection's address.
	refusedConn atomic.Bool
	// logAllowed writes an allowed request's decision line, once: when its upstream
	// connection is known, so that addr is the address dialled (fail-over and pooled
	// connections included), or when the round trip ended without one. nil unless allowed.
	logAllowed func()
}

// answerBody records in st the error that ends an upstream answer's body early. An
// answer from net/http's Transport has its reads watched for the idle timeout (the
// upstream client's connection has a read deadline instead: see upclient).
type answerBody struct {
	io.ReadCloser
	st    *requestState
	watch connio.ReadWatch
}

func (b *answerBody) Read(p []byte) (n int, err error) {
	if b.watch.Timeout() > 0 {
		n, err = b.watch.Read(b.ReadCloser, p, b.st.client)
	} else {
		n, err = b.ReadCloser.Read(p)
	}
	if err != nil && err != io.EOF && b.st.answerErr == nil {
		b.st.answerErr = err
	}
	return n, err
}

func (b *answerBody) Close() error {
	if b.watch.Timeout() > 0 {
		b.watch.Stop()
	}
	return b.ReadCloser.Close()
}

// upstreamAnswer is what the client gets of an allowed request's round trip: the
// upstream's answer, its body wrapped in answerBody (not a 101's, which goproxy relays
// as the upstream connection itself); or, when there is none, a 502 that says whether
// the dial or the exchange failed, or a 504 when the upstream sent no answer head for
// the tunnel idle timeout (goproxy would answer 500 with the error's text). A client
// that stopped sending its request body gets no answer: the front closes its
// connection (see httpfront).
//
// A 101 is relayed only as the websocket handshake the request asked for (goproxy
// would stream any other upgrade one way, unbounded). Its upstream connection closes
// with a swap's cut (before the swap returns) and when the request's context ends (the
// drain's deadline, the relay's idle timeout, the end of the relay): goproxy's copies
// have no deadline on that side.
func (s *Server) upstreamAnswer(req *http.Request, st *requestState, v *Verdict, resp *http.Response, err error) (*http.Response, error) {
	if err == nil && httpfront.FieldCount(resp.Header) > httpfront.MaxHeadFields {
		resp.Body.Close()
		resp, err = nil, fmt.Errorf("%w: more than %d fields", upclient.ErrAnswerHeadTooLong, httpfront.MaxHeadFields)
	}
	if err != nil {
		if errors.Is(err, upclient.ErrRecheckFailed) || errors.Is(err, dnsupstream.ErrPolicyChanged) || st.refusedConn.Load() {
			// A refusal, not an upstream failure: answered and counted as a CONNECT
			// cut the same way is.
			cur := s.current.Load()
			refused := Verdict{Host: v.Host, Name: v.Name, Port: v.Port, Reason: ReasonPolicyChanged}
			typ, o := st.recordAs()
			s.recordOrigin(cur, typ, refused, req.RemoteAddr, o)
			return refusalResponse(req, cur, typ, refused), nil
		}
		if errors.Is(err, connio.ErrClientBodyIdle) {
			// Never written: the front sees the body idle and closes the connection.
			return &http.Response{StatusCode: http.StatusRequestTimeout, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		}
		// A request whose context ended was cut by a swap or the drain, not by the
		// upstream, unless the head watch ended it.
		if req.Context().Err() == nil || st.head.Fired() {
			switch {
			case errors.Is(err, connio.ErrUpstreamHeadIdle):
				s.logIdle(st, "answer idle", req.RemoteAddr, "upstream")
			case errors.Is(err, connio.ErrUpstreamBodyIdle):
				s.logIdle(st, "request body idle", req.RemoteAddr, "upstream")
			}
		}
		return s.gatewayError(req, v, err), nil
	}
	// The field is the proxy's word on an answer: an upstream's own would pass, to the
	// client and whoever reads its logs, for a refusal or an error of the proxy's.
	resp.Header.Del("X-Compass-Egress")
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if !httpfront.IsWebsocketUpgrade(req.Header) || !httpfront.IsWebsocketUpgrade(resp.Header) {
			resp.Body.Close()
			return s.gatewayError(req, v, fmt.Errorf("proxy: 101 answer upgrading to %q, not to the websocket asked for", resp.Header.Get("Upgrade"))), nil
		}
		st.client.relay(resp.Body)
		context.AfterFunc(req.Context(), func() { resp.Body.Close() })
		return resp, nil
	}
	// Upgrade is hop-by-hop, and the client's head goes without it (httpfront drops it); goproxy
	// would take an answer that names websocket in it (a 426, say) for the handshake
	// and hijack the connection, cutting the answer after its head.
	resp.Header.Del("Upgrade")
	if resp.Body != nil && resp.Body != http.NoBody {
		st.answer.ReadCloser, st.answer.st = resp.Body, st
		resp.Body = &st.answer
	}
	return resp, nil
}

// gatewayError is the answer to an allowed request without a usable upstream answer:
// a 502, or a 504 when for the tunnel idle timeout the upstream sent no answer head or
// took none of the request (logged by the caller as "answer idle" or "request body
// idle").
func (s *Server) gatewayError(req *http.Request, v *Verdict, err error) *http.Response {
	status, reason, text := http.StatusBadGateway, "upstream-failed", " could not be reached"
	st := stateIn(req.Context())
	var malformed error
	var cutShort bool
	if st != nil {
		malformed, cutShort = st.fr.BodyFault()
	}
	switch {
	case malformed != nil:
		status, reason, text = http.StatusBadRequest, "bad-request-body", " was not sent the rest of a malformed request body"
		s.log.Info("request body malformed", "type", typeHTTP, "host", blockedHost(*v), "port", v.Port, "client", req.RemoteAddr, "error", clipError(malformed))
	case cutShort:
		reason, text = "client-gone", " was not sent the whole request: the client closed its connection before the body's end"
	case isDialError(err):
		reason = "dial-failed"
	case errors.Is(err, connio.ErrUpstreamHeadIdle):
		status, reason, text = http.StatusGatewayTimeout, "upstream-timeout", " sent no answer"
	case errors.Is(err, connio.ErrUpstreamBodyIdle):
		status, reason, text = http.StatusGatewayTimeout, "upstream-timeout", " took none of the request"
	case st != nil && st.fr.ClientLeft():
		// A half-closed client may still read: the answer says whose end it was.
		reason, text = "client-gone", " was not waited for: the client closed its connection"
	}
	upstreamsFault := reason == "upstream-failed" || reason == "dial-failed"
	if upstreamsFault && req.Context().Err() == nil { // else cut by a swap or the drain: not the upstream's failure
		s.log.Warn("upstream failed", "type", typeHTTP, "host", blockedHost(*v), "port", v.Port, "client", req.RemoteAddr, "error", clipError(err))
	}
	resp := goproxy.NewResponse(req, goproxy.ContentTypeText, status,
		"compass-egress: "+blockedHost(*v)+text+" ("+reason+")\n")
	resp.Header.Set("X-Compass-Egress", "error; reason="+reason)
	return resp
}

func isDialError(err error) bool {
	op := (*net.OpError)(nil)
	return errors.As(err, &op) && op.Op == "dial"
}

type stateKey struct{}

// requestClient is the front's handle on the client of a request: a swap that cuts
// the request closes the connection and cancels the request, which also ends its
// upstream exchange, and closes the upstream side of a websocket relay before it
// returns.
type requestClient struct {
	s      *Server
	conn   net.Conn
	cancel context.CancelFunc

	mu       sync.Mutex
	done     bool      // cut
	upgraded io.Closer // a relayed 101's upstream connection
	upstream net.Conn  // the upstream connection the request sends on (see hold)
}

func (c *requestClient) cut() {
	c.mu.Lock()
	c.done = true
	up := c.upgraded
	c.mu.Unlock()
	c.conn.Close()
	if up != nil {
		up.Close()
	}
	c.cancel()
}

// Cancel cancels the request, for the watches that bound it (connio.Request).
func (c *requestClient) Cancel() { c.cancel() }

// Recovered reports a panic the request's watches (GoneWatch, HeadWatch, ReadWatch,
// its websocket relay's idle watch and copies) recovered on goroutines of their own,
// and cuts the request: its connection, its upstream exchange or relay, end with it,
// as a panic ends the connection it happens on.
func (c *requestClient) Recovered(p any) {
	c.s.recovered(componentFront, typeHTTP, c.conn.RemoteAddr().String(), p)
	c.cut()
}

// relay records a 101's upstream connection for cut to close, or closes it at once
// when the request was cut already.
func (c *requestClient) relay(up io.Closer) {
	c.mu.Lock()
	done := c.done
	if !done {
		c.upgraded = up
	}
	c.mu.Unlock()
	if done {
		up.Close()
	}
}

func withState(ctx context.Context, st *requestState) context.Context {
	return context.WithValue(ctx, stateKey{}, st)
}

// stateIn is the state of the request whose context (or a context derived from it) is
// ctx, or nil.
func stateIn(ctx context.Context) *requestState {
	st, _ := ctx.Value(stateKey{}).(*requestState)
	return st
}

// live is the rule set that decided st's request and its tracked entry; nil for a
// request without state.
func (st *requestState) live() (*RuleSet, *liveConn) {
	if st == nil {
		return nil, nil
	}
	return st.rs, st.entry
}

// newGoproxy wires the decision hooks into goproxy: a request handler for absolute-URI
// requests, a CONNECT handler, and a refusal for everything that is not a proxy request.
func (s *Server) newGoproxy() *goproxy.ProxyHttpServer {
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = goproxyLogger{s}
	gp.KeepAcceptEncoding = true
	gp.ConnectDial = nil
	// Fail closed: every allowed request carries its own round tripper, so this one
	// only ever runs if a code path forgot to decide.
	gp.Tr = &http.Transport{Proxy: nil, DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("proxy: undecided request")
	}}
	gp.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs := s.current.Load()
		v := Verdict{Host: r.Host, Reason: ReasonNotProxyRequest}
		s.record(rs, typeHTTP, v, r.RemoteAddr)
		writeRefusal(w, rs, typeHTTP, v)
	})
	gp.OnRequest().DoFunc(s.decideHTTP)
	// The front serves every CONNECT itself; this keeps goproxy from ever dialling one.
	gp.OnRequest().HandleConnectFunc(func(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		ctx.Resp = refusalResponse(ctx.Req, s.current.Load(), typeConnect, Verdict{Host: host, Reason: ReasonUnsupported})
		return &goproxy.ConnectAction{Action: goproxy.ConnectReject}, host
	})
	return gp
}

// serveProxy runs goproxy on one request the front read, whose context carries st
// (withState), then settles what goproxy leaves behind (tracking, hijacked
// connections, the previous generation's idle upstream connections).
func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request, st *requestState) {
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		r.Body = &countingBody{ReadCloser: r.Body, n: &st.up}
	}
	rw := &proxyResponseWriter{ResponseWriter: w, st: st, idle: s.cfg.TunnelIdleTimeout}
	if st.origin.IsValid() {
		originForm(r, st)
	}
	// Deferred, so a panic in the handler chain (which the front recovers) still
	// gives back the tracker entry, the gauge and the connection slot.
	defer s.settle(st)
	s.relay.ServeHTTP(rw, r)
}

// settle releases what a request held once goproxy is done with it.
func (s *Server) settle(st *requestState) {
	if st.logAllowed != nil {
		st.logAllowed() // no round trip ran (it writes nothing if one did)
	}
	if st.relay != nil {
		// A websocket relay: goproxy is done with the connection but does not always
		// close it, and one of its copies may still be in a read or write of it. Once
		// closed and quiet, its counts are final.
		st.relayIdle()
		st.relay.Conn.Close()
		st.relay.Quiesce()
		s.proxyLn.Release()
	}
	if st.entry != nil {
		s.tracker.remove(st.entry)
		s.release(st.client)
		s.metrics.activeHTTP.Dec()
		s.metrics.bytesUp.Add(float64(st.up.Load()))
		s.metrics.bytesDown.Add(float64(st.down.Load()))
	}
	if st.relay != nil && st.entry != nil && s.log.Enabled(context.Background(), slog.LevelInfo) {
		s.logLine(slog.LevelInfo, "websocket closed", slog.String("type", typeHTTP),
			slog.String("host", st.entry.name), slog.Int("port", int(st.entry.port)), slog.String("addr", s.tracker.addrOf(st.entry).String()),
			slog.String("client", st.client.conn.RemoteAddr().String()), slog.Int64("bytes_up", st.up.Load()), slog.Int64("bytes_down", st.down.Load()),
			slog.Float64("duration_seconds", time.Since(st.relayStart).Seconds()), slog.Uint64("generation", st.rs.Generation),
			slog.String("task", st.rs.Task), slog.String("phase", st.rs.Phase))
	}
	if st.rs != nil && st.rs != s.current.Load() {
		st.rs.closeIdle()
	}
}

// logIdle logs the end of an allowed request that moved no byte for the tunnel idle
// timeout: msg says what stalled ("answer idle", "request body idle"), side which end
// ("client" or "upstream").
func (s *Server) logIdle(st *requestState, msg, client, side string) {
	if st.entry == nil {
		return
	}
	s.log.Warn(msg, "type", typeHTTP, "host", st.entry.name, "port", st.entry.port, "client", client,
		"side", side, "idle_seconds", s.cfg.TunnelIdleTimeout.Seconds())
}

// decideHTTP decides an absolute-URI request and, if it is allowed, readies its
// forwarding: the upstream client's round trip, or net/http's Transport's.
func (s *Server) decideHTTP(r *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	st := stateIn(r.Context())
	rs := s.current.Load()
	st.rs = rs
	v := s.verdictHTTP(r, st, rs)
	if v.Allowed {
		rs, v = s.trackHTTP(st, rs, v)
	}
	rs = s.decidedBy(rs, v)
	if !v.Allowed {
		if v.Host == "" {
			// A target net/http read no host from ("connect b.test:443" is a URI of
			// scheme b.test, "http:b.test/" one without an authority) is logged and
			// listed as written, not as a refusal of nothing.
			v.Host = asWritten(r.RequestURI)
		}
		typ, o := st.recordAs()
		s.recordOrigin(rs, typ, v, r.RemoteAddr, o)
		return r, refusalResponse(r, rs, typ, v)
	}
	st.verdict = v
	s.readyForward(r, st, rs)
	if upclient.Handles(r) {
		ctx.RoundTripper = s.viaUpstreamClient(st, rs)
		return r, nil
	}
	r, ctx.RoundTripper = s.viaTransport(r, st, rs)
	return r, nil
}

// verdictHTTP is rs's verdict on r. The destination is the URI's authority, and the
// upstream is sent that authority as Host (RFC 9112 §3.2.2). A Host field that names
// another destination is refused all the same: a client that says two things is not
// one to guess for.
func (s *Server) verdictHTTP(r *http.Request, st *requestState, rs *RuleSet) Verdict {
	v := Verdict{Host: r.URL.Host}
	var defaultPort uint16
	switch {
	case r.URL.User != nil:
		// Logged with the userinfo: the host after the @ may be an allowed name.
		v.Host, v.Reason = asWritten(r.URL.User.String()+"@"+r.URL.Host), ReasonUserinfo
	case r.URL.Scheme == "http":
		defaultPort = 80
	case r.URL.Scheme == "https":
		defaultPort = 443
	default:
		v.Reason = ReasonBadScheme
	}
	if v.Reason == "" && len(r.Header.Values("Upgrade")) > 0 && !httpfront.UpgradesToWebsocket(r.Header) {
		v.Reason = ReasonUnsupported
	}
	if v.Reason != "" {
		return v
	}
	if st.origin.IsValid() { // a Host without a port names the original one
		defaultPort = st.origin.Port()
	}
	host, port, reason := splitAuthority(r.URL.Host, defaultPort)
	if reason != "" {
		v.Reason = reason
		return v
	}
	v = s.decide(r.Context(), rs, host, port)
	if v.Allowed && st.fr.HostSent && !sameAuthority(st.fr.Host, r.URL.Host, defaultPort) {
		v.Allowed, v.Addrs, v.Reason, v.Rule = false, nil, ReasonHostMismatch, ""
	}
	if v.Allowed && st.origin.IsValid() {
		client, _ := netip.ParseAddrPort(r.RemoteAddr)
		v = s.pinOrigin(rs, client.Addr().Unmap(), st.origin, v, ReasonHostAddressMismatch)
	}
	return v
}

// trackHTTP tracks the allowed request of st, which a swap then cuts, and re-decides
// it if a swap came since rs decided it. It returns the verdict that stands and the
// rule set it is logged, counted and explained under.
func (s *Server) trackHTTP(st *requestState, rs *RuleSet, v Verdict) (*RuleSet, Verdict) {
	entry := &liveConn{typ: typeHTTP, name: v.Name, addr: v.Addrs[0], port: v.Port}
	entry.close = func() func() {
		if st.client != nil {
			st.client.cut()
			s.closeHeld(st.client)
		}
		return nil
	}
	s.tracker.add(entry)
	if cur := s.current.Load(); cur != rs {
		if v = s.redecide(cur, v); !v.Allowed {
			rs = cur // refused by the swap's set: logged, counted and explained under it
		}
	}
	if v.Allowed {
		st.entry = entry
		s.metrics.activeHTTP.Inc()
	} else {
		s.tracker.remove(entry)
	}
	return rs, v
}

// readyForward readies the allowed request r, of state st decided under rs, to go
// upstream: its decision line, written once its upstream connection is known, and the
// fields it is sent with.
func (s *Server) readyForward(r *http.Request, st *requestState, rs *RuleSet) {
	var once sync.Once
	allowed, client := st.verdict, r.RemoteAddr
	typ, o := st.recordAs()
	st.logAllowed = func() {
		once.Do(func() {
			allowed.Addr = s.tracker.addrOf(st.entry)
			s.recordOrigin(rs, typ, allowed, client, o)
		})
	}
	if name := st.verdict.Name; name != "" && hasNonASCII(r.URL.Host) {
		// The decision read the name through IDNA's mapping ("a。test" is a.test), but
		// net/http would write the Host field as punycode alone (xn--atest-7t3d), another
		// name, while it verifies TLS for the mapped one (golang/go#80417): the upstream
		// is sent the name decided.
		host := name
		if p := r.URL.Port(); p != "" {
			host = net.JoinHostPort(host, p)
		}
		r.URL.Host, r.Host = host, host
	}
	httpfront.DropConnectionFields(r.Header)
	if _, ok := r.Header["User-Agent"]; !ok {
		// An empty field is how net/http's writers of a request are told to send none
		// rather than their own: the upstream must not take the proxy for the client.
		r.Header["User-Agent"] = []string{""}
	}
}

// viaUpstreamClient is the round trip of st's request through rs's upstream client.
func (s *Server) viaUpstreamClient(st *requestState, rs *RuleSet) goproxy.RoundTripper {
	return goproxy.RoundTripperFunc(func(req *http.Request, _ *goproxy.ProxyCtx) (*http.Response, error) {
		t := upclient.Target{Host: st.verdict.Host, Addrs: st.verdict.Addrs, Port: st.verdict.Port}
		resp, err := rs.upstream.RoundTrip(req, t, func(c net.Conn) bool {
			s.hold(st.client, c)
			ok := s.gotUpstreamConn(rs, st.entry, c)
			st.logAllowed()
			return ok
		})
		st.logAllowed()
		return s.upstreamAnswer(req, st, &st.verdict, resp, err)
	})
}

// viaTransport is the round trip of r, st's request, through rs's net/http Transport,
// which dials st's verdict (dialChecked), and r as that round trip sends it, with the
// hooks that bound its answer's heads and report its connection.
func (s *Server) viaTransport(r *http.Request, st *requestState, rs *RuleSet) (*http.Request, goproxy.RoundTripper) {
	st.head.SetTimeout(s.cfg.TunnelIdleTimeout)
	r = r.WithContext(httptrace.WithClientTrace(r.Context(), s.transportTrace(st, rs)))
	return r, goproxy.RoundTripperFunc(func(req *http.Request, _ *goproxy.ProxyCtx) (*http.Response, error) {
		resp, err := rs.transport.RoundTrip(req)
		st.logAllowed()
		st.head.Stop()
		if st.head.Fired() {
			if resp != nil { // the head came as the watch fired: its body's reads would fail
				resp.Body.Close()
			}
			resp, err = nil, connio.ErrUpstreamHeadIdle
		}
		st.answer.watch.SetTimeout(s.cfg.TunnelIdleTimeout)
		return s.upstreamAnswer(req, st, &st.verdict, resp, err)
	})
}

// transportTrace is the Transport's report of st's round trip: its interim answers,
// bounded as the upstream client bounds them (with this hook the Transport bounds each
// head by itself, no longer all of them together, so their size is counted here; it
// reads a request's heads on one goroutine), the connection it got, and the end of
// the request's writing.
func (s *Server) transportTrace(st *requestState, rs *RuleSet) *httptrace.ClientTrace {
	interim, interimBytes := 0, 0
	return &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			if interim++; interim > upclient.MaxInterimAnswers {
				return upclient.ErrTooManyInterimAnswers
			}
			for k, vs := range h {
				for _, v := range vs {
					interimBytes += len(k) + len(v) + len(": \r\n")
				}
			}
			if interimBytes > upclient.MaxAnswerHeadBytes {
				return upclient.ErrAnswerHeadTooLong
			}
			return nil
		},
		GotConn: func(info httptrace.GotConnInfo) {
			s.hold(st.client, info.Conn)
			if !s.gotUpstreamConn(rs, st.entry, info.Conn) {
				st.refusedConn.Store(true)
			}
			st.logAllowed()
			st.head.GotConn(info.Conn)
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				st.head.Wrote(st.client)
			}
		},
	}
}

// gotUpstreamConn records the address an HTTP request's upstream connection really
// goes to (a pooled connection may predate the request's own lookup) and, when a swap
// came after the request was decided, re-checks that address under the rule set in
// force: a connection it no longer allows is closed before the request is written. The
// address is recorded first, so a sweep that starts later sees it (see tracker.closeIf).
func (s *Server) gotUpstreamConn(rs *RuleSet, entry *liveConn, c net.Conn) bool {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return true
	}
	s.tracker.setAddr(entry, ap.Addr().Unmap())
	if cur := s.current.Load(); cur != rs && !s.decider.Recheck(cur, entry.name, ap.Addr(), entry.port) {
		c.Close()
		return false
	}
	return true
}

// hold records c as the upstream connection cl's request sends on, for the request's
// cut to close before a swap returns: the request's cancellation closes it only later,
// on another goroutine. A pooled connection goes on to other requests, so s.held says
// which request holds each one, and only that request's cut closes it.
func (s *Server) hold(cl *requestClient, c net.Conn) {
	s.held.Store(c, cl)
	cl.mu.Lock()
	prev, done := cl.upstream, cl.done
	cl.upstream = c
	cl.mu.Unlock()
	if prev != nil && prev != c { // a retry on a new connection
		s.held.CompareAndDelete(prev, cl)
	}
	if done {
		s.closeHeld(cl)
	}
}

// closeHeld closes the upstream connection cl's request sends on, if it still holds
// it, and forgets it.
func (s *Server) closeHeld(cl *requestClient) {
	cl.mu.Lock()
	c := cl.upstream
	cl.upstream = nil
	cl.mu.Unlock()
	if c != nil && s.held.CompareAndDelete(c, cl) {
		c.Close()
	}
}

// release forgets the upstream connection cl's request sent on, leaving it open.
func (s *Server) release(cl *requestClient) {
	cl.mu.Lock()
	c := cl.upstream
	cl.upstream = nil
	cl.mu.Unlock()
	if c != nil {
		s.held.CompareAndDelete(c, cl)
	}
}

// redecide re-checks an allowed verdict's addresses under a rule set published while
// the verdict was being made.
func (s *Server) redecide(rs *RuleSet, v Verdict) Verdict {
	kept := v.Addrs[:0:0]
	for _, a := range v.Addrs {
		if s.decider.Recheck(rs, v.Name, a, v.Port) {
			kept = append(kept, a)
		}
	}
	if len(kept) == 0 {
		d := rs.Matcher.Decide(v.Name, v.Addrs[0], v.Port)
		v.Allowed, v.Addrs, v.Reason, v.Rule = false, nil, string(d.Reason), ruleString(d.Rule)
		if d.Allowed {
			v.Reason, v.Rule = ReasonInternalAddress, ""
		}
		return v
	}
	v.Addrs = kept
	return v
}

// decide resolves and checks with the DNS time budget. An address literal needs no
// lookup, so it skips the budget's timer.
func (s *Server) decide(ctx context.Context, rs *RuleSet, host string, port uint16) Verdict {
	if _, err := netip.ParseAddr(host); err == nil {
		return s.decider.Decide(ctx, rs, host, port)
	}
	ctx, cancel := context.WithTimeout(ctx, dnsupstream.LookupBudget(s.cfg.DNSTimeout, len(s.cfg.DNSUpstreams)))
	defer cancel()
	return s.decider.Decide(ctx, rs, host, port)
}

// errDialPanicked fails a dial that panicked.
var errDialPanicked = errors.New("proxy: the dial panicked")

// dialChecked is the upstream transport's dialer: it dials only the addresses the
// request's verdict checked, ignoring the address the transport asks for. Its writes
// are bounded by the tunnel idle timeout (see connio.IdleWriter), its reads are the progress
// of the wait for an answer head (see connio.HeadWatch).
func (s *Server) dialChecked(ctx context.Context, network, _ string) (_ net.Conn, err error) {
	st := stateIn(ctx)
	if st == nil || !st.verdict.Allowed {
		return nil, errors.New("proxy: dial without an allowed decision")
	}
	var c *net.TCPConn
	// The Transport dials on a goroutine of its own, which nothing else recovers: a
	// panic fails this dial (and with it the request), and closes what it dialled.
	defer func() {
		if p := recover(); p != nil {
			client := ""
			if st.client != nil {
				client = st.client.conn.RemoteAddr().String()
			}
			s.recovered(componentFront, typeHTTP, client, p)
			if c != nil {
				c.Close()
			}
			err = errDialPanicked
		}
	}()
	rs, entry := st.live()
	// The Transport dials under a context without the request's cancellation (a
	// request that gives up leaves the connection to the pool): the end of the
	// request, a swap's cut included, must end its dial too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(st.ctx, cancel)
	defer stop()
	c, _, err = s.dialVerdict(ctx, nil, &st.verdict, true, rs, entry)
	if err != nil {
		return nil, err
	}
	return connio.NewUpstreamConn(c, s.cfg.TunnelIdleTimeout), nil
}

// upstreamDialer is the upstream client's dialer: the request whose context is ctx
// dials t under the rule set that decided it (see dialVerdict).
type upstreamDialer struct{ s *Server }

func (d upstreamDialer) DialUpstream(ctx context.Context, t upclient.Target) (*net.TCPConn, netip.Addr, error) {
	rs, entry := stateIn(ctx).live()
	v := Verdict{Host: t.Host, Addrs: t.Addrs, Port: t.Port}
	return d.s.dialVerdict(ctx, nil, &v, true, rs, entry)
}

// dialVerdict tries each checked address in turn. keepAlive turns TCP keep-alive on at
// once (connio.UpstreamKeepAlive); a tunnel's dial leaves it off and its idle watch turns it
// on if the tunnel lives, since its four setsockopt calls were a tenth of the system
// calls of a tunnel set-up and most tunnels end sooner. entry, when not nil, is the
// live connection the dial is for, decided under rs: each address is admitted first
// (see admitAddr), and when the rule set in force refused one and no other could be
// dialled the error is dnsupstream.ErrPolicyChanged. Each attempt runs under ctx, or, when stop is
// not nil, under a context of stop's (see connio.DialStop) instead.
func (s *Server) dialVerdict(ctx context.Context, stop *connio.DialStop, v *Verdict, keepAlive bool, rs *RuleSet, entry *liveConn) (*net.TCPConn, netip.Addr, error) {
	d := net.Dialer{Timeout: s.cfg.DialTimeout, KeepAlive: -1, Control: s.cfg.dialControl}
	if keepAlive {
		d.KeepAliveConfig = connio.UpstreamKeepAlive
	}
	dial := d.DialContext
	if s.cfg.dial != nil {
		dial = s.cfg.dial
	}
	var lastErr error
	refused := false
	for _, a := range v.Addrs {
		if err := ctx.Err(); err != nil {
			// The request ended (a swap's cut, the drain's deadline, its client gone):
			// no address is left to try, and one a later swap refuses would turn a
			// drain into a policy refusal. The error stays the last attempt's, if any,
			// as with a name of one address: the answer (502 dial-failed for a dial
			// error) must not depend on how many addresses the name has.
			if lastErr == nil {
				lastErr = err
			}
			break
		}
		if entry != nil && !s.admitAddr(rs, entry, a) {
			refused = true
			continue
		}
		start := time.Now()
		actx, done := ctx, context.CancelFunc(nil)
		if stop != nil {
			actx, done = stop.Attempt(s.cfg.DialTimeout)
		}
		c, err := dial(actx, "tcp", netip.AddrPortFrom(a, v.Port).String())
		if done != nil {
			done()
		}
		s.metrics.dialDuration.Observe(time.Since(start).Seconds())
		if err != nil {
			lastErr = err
			continue
		}
		return c.(*net.TCPConn), a, nil
	}
	if refused { // what is left to try, the rule set in force refuses
		lastErr = dnsupstream.ErrPolicyChanged
	}
	return nil, netip.Addr{}, fmt.Errorf("proxy: dial %s: %w", v.Host, lastErr)
}

// admitAddr records a as the address entry's connection is about to go to and, when a
// swap came after rs decided it, re-checks a under the rule set in force. The address
// is recorded first, so a sweep that starts later sees it and cuts the dial (see
// tracker.closeIf): either way nothing is dialled that a swap which has returned
// refuses.
func (s *Server) admitAddr(rs *RuleSet, entry *liveConn, a netip.Addr) bool {
	s.tracker.setAddr(entry, a)
	cur := s.current.Load()
	return cur == rs || s.decider.Recheck(cur, entry.name, a, entry.port)
}

// record logs one decision and counts it.
func (s *Server) record(rs *RuleSet, typ string, v Verdict, client string) {
	s.recordOrigin(rs, typ, v, client, transparentOrigin{})
}

// recordOrigin is record for a connection that may have come transparently to o: its
// line names the protocol and the original destination, its blocked entry the protocol.
func (s *Server) recordOrigin(rs *RuleSet, typ string, v Verdict, client string, o transparentOrigin) {
	decision := decisionLabel(v.Allowed)
	s.metrics.requests.WithLabelValues(typ, decision, v.Reason).Inc()
	if !v.Allowed {
		rs.blocked.Add(blocked.Key{Host: clipHost(blockedHost(v)), Port: v.Port, Type: typ, Reason: v.Reason, Protocol: o.protocol})
	}
	if o.protocol == "" {
		s.logDecision(rs, typ, decision, v.Reason, v.Rule, blockedHost(v), v.Port, v.Addr, client)
		return
	}
	s.logDecision(rs, typ, decision, v.Reason, v.Rule, blockedHost(v), v.Port, v.Addr, client,
		slog.String("protocol", o.protocol), slog.String("original_dst", o.dst.String()))
}

func blockedHost(v Verdict) string {
	if v.Name != "" {
		return v.Name
	}
	return v.Host
}

// refusalText is the one-line body of a refusal: what, under which mode, why.
func refusalText(rs *RuleSet, typ string, v Verdict) string {
	what := v.Host
	if v.Port != 0 {
		what = net.JoinHostPort(blockedHost(v), fmt.Sprint(v.Port))
	}
	return fmt.Sprintf("compass-egress: %s to %s denied by the %s policy (generation %d): %s\n",
		strings.ToUpper(typ), what, rs.Mode(), rs.Generation, v.Reason)
}

func refusalHeader(v Verdict) string { return "denied; reason=" + v.Reason }

func refusalResponse(r *http.Request, rs *RuleSet, typ string, v Verdict) *http.Response {
	resp := goproxy.NewResponse(r, goproxy.ContentTypeText, http.StatusForbidden, refusalText(rs, typ, v))
	resp.Header.Set("X-Compass-Egress", refusalHeader(v))
	if typ == typeConnect {
		resp.Close = true
	}
	return resp
}

func writeRefusal(w http.ResponseWriter, rs *RuleSet, typ string, v Verdict) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Compass-Egress", refusalHeader(v))
	w.WriteHeader(http.StatusForbidden)
	_, _ = io.WriteString(w, refusalText(rs, typ, v))
}

// proxyResponseWriter counts response bytes and remembers a hijack, keeping the bytes
// the server had already read past the request (a tunnel must forward them).
type proxyResponseWriter struct {
	http.ResponseWriter
	st   *requestState
	idle time.Duration // a hijacked websocket's idle timeout
}

func (w *proxyResponseWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.st.down.Add(int64(n))
	// goproxy flushes only responses it recognises as streams; a proxy must not
	// hold back any response body (long polls, chunked streams), so flush each write.
	if f, ok := w.ResponseWriter.(http.Flusher); ok && err == nil {
		f.Flush()
	}
	return n, err
}

// ReadFrom copies a response body through a pooled buffer: goproxy's io.Copy would
// otherwise allocate 32 KiB for every response.
func (w *proxyResponseWriter) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{w}, r, *bp)
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (w *proxyResponseWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *proxyResponseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("proxy: connection cannot be hijacked")
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	st := w.st
	st.relayStart = time.Now()
	// goproxy relays the bytes the front had read past the request itself.
	st.up.Add(int64(rw.Reader.Buffered()))
	// A websocket relay (goproxy's, through this connection both ways): every byte
	// passes c, which stamps the clock; once the relay idles, a cut ends both sides
	// (a copy blocked writing to an upstream that reads nothing never sees c's deadline).
	clock := connio.NewIdleClock(w.idle)
	cl := st.client
	st.relayIdle = connio.WatchIdle(clock, func(p any) {
		if p != nil {
			cl.Recovered(p)
			return
		}
		cl.cut()
	})
	st.relay = connio.NewIdleConn(c, clock, &st.up, &st.down, cl)
	return st.relay, rw, nil
}

func (w *proxyResponseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// goproxyLogger sends goproxy's own messages to the debug log.
type goproxyLogger struct{ s *Server }

func (l goproxyLogger) Printf(format string, v ...any) {
	l.s.log.Debug("goproxy", "message", strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// asWritten is a refused target as the client wrote it, for logs and /v1/blocked, with
// anything a reader could take for a password masked as "xxxxx": in each part between
// slashes, from its first ':' to its last '@'. "b.test:1@a.test" names the destination
// sought in its user name, which stays; "http://me:pw@a.test" is no userinfo to
// net/http as a CONNECT target, but its password is one all the same.
func asWritten(target string) string {
	parts := strings.Split(target, "/")
	for i, p := range parts {
		at := strings.LastIndexByte(p, '@')
		if colon := strings.IndexByte(p, ':'); colon >= 0 && colon < at {
			parts[i] = p[:colon+1] + "xxxxx" + p[at:]
		}
	}
	return strings.Join(parts, "/")
}

// hasNonASCII reports whether s has a byte outside ASCII.
func hasNonASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return true
		}
	}
	return false
}
