package proxy

import (
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/compass-egress/compass-egress/proxy/httpfront"
	"github.com/compass-egress/compass-egress/proxy/transparent"
)

// frontHandler is the sidecar as the HTTP front's Handler: it decides and serves the
// requests the front read, and logs and counts what the front refused.
type frontHandler struct{ s *Server }

// newFront is the front of s's proxy listener.
func (s *Server) newFront() *httpfront.Front {
	return httpfront.New(httpfront.Config{
		Listener: s.proxyLn, Handler: frontHandler{s}, Log: s.log,
		HeaderTimeout: s.cfg.HeaderTimeout, IdleTimeout: s.cfg.IdleTimeout, TunnelIdleTimeout: s.cfg.TunnelIdleTimeout,
		ClientWatchDelay: s.cfg.clientWatchDelay,
	})
}

func (h frontHandler) Connect(r *httpfront.Request, req *http.Request) bool {
	return h.s.serveConnect(r, req)
}

// Forward is the state of r, a request the front reads, for goproxy's handler chain.
func (h frontHandler) Forward(r *httpfront.Request) httpfront.Exchange {
	st := &requestState{client: &requestClient{s: h.s, conn: r.Conn, cancel: r.Cancel}, ctx: r.Ctx, fr: r, origin: r.Origin}
	if r.HasBody() {
		st.head.OnConnEnd = r.StopBody
	}
	return st
}

// Refused counts and logs a head the front would not serve as a decision; on a
// transparent connection, as that connection's (type, protocol, original destination).
func (h frontHandler) Refused(typ, reason, host, client string, origin netip.AddrPort) {
	s := h.s
	if !origin.IsValid() {
		s.metrics.requests.WithLabelValues(typ, "denied", reason).Inc()
		s.logDecision(s.current.Load(), typ, "denied", reason, "", host, 0, netip.Addr{}, client)
		return
	}
	s.metrics.requests.WithLabelValues(typeTransparent, "denied", reason).Inc()
	s.logDecision(s.current.Load(), typeTransparent, "denied", reason, "", host, 0, netip.Addr{}, client,
		slog.String("protocol", transparent.HTTP), slog.String("original_dst", origin.String()))
}

func (h frontHandler) Recovered(typ, client string, p any) {
	h.s.recovered(componentFront, typ, client, p)
}

// serveConnect serves a CONNECT: decided, refused or tunnelled. It reports whether the
// tunnel took the connection.
func (s *Server) serveConnect(r *httpfront.Request, req *http.Request) bool {
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
		v = s.decideTunnel(r.Ctx, rs, req.URL.Host, req.RemoteAddr)
	}
	if !v.Allowed {
		_ = r.Conn.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
		_ = refusalResponse(req, s.decidedBy(rs, v), typeConnect, v).Write(r.Conn)
		return false
	}
	return s.openTunnel(r.Ctx, r.Cancel, r.Rearm, req, r.Conn, r.Buffered, rs, v)
}

// The methods of an httpfront.Exchange: the front runs st's request through them.

func (st *requestState) Cancel()          { st.client.Cancel() }
func (st *requestState) Recovered(p any)  { st.client.Recovered(p) }
func (st *requestState) Relayed() bool    { return st.relay != nil }
func (st *requestState) AnswerErr() error { return st.answerErr }

// Serve runs goproxy on req, whose context carries st from here on.
func (st *requestState) Serve(w http.ResponseWriter, req *http.Request) {
	st.client.s.serveProxy(w, req.WithContext(withState(st.ctx, st)), st)
}

// Report logs how st's request ended short, if it was allowed.
func (st *requestState) Report(ev httpfront.Event, err error) {
	if st.entry == nil {
		return
	}
	s, client := st.client.s, st.fr.Client
	switch ev {
	case httpfront.ClientGone:
		s.log.Info("client gone", "type", typeHTTP, "host", st.entry.name, "port", st.entry.port, "client", client)
	case httpfront.UpstreamFailed:
		s.log.Warn("upstream failed", "type", typeHTTP, "host", st.entry.name, "port", st.entry.port, "client", client, "error", clipError(err))
	case httpfront.RequestBodyIdle:
		s.logIdle(st, "request body idle", client, "client")
	case httpfront.AnswerIdleUpstream:
		s.logIdle(st, "answer idle", client, "upstream")
	case httpfront.AnswerIdleClient:
		s.logIdle(st, "answer idle", client, "client")
	}
}

var (
	_ httpfront.Handler  = frontHandler{}
	_ httpfront.Exchange = (*requestState)(nil)
)
