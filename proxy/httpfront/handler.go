package httpfront

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// Connection types, as the sidecar's logs and metric labels name them.
const (
	TypeHTTP    = "http"
	TypeConnect = "connect"
)

// Reason codes of the heads the front refuses to serve, as the sidecar's logs, the
// X-Compass-Egress header and the reason metric label name them.
const (
	ReasonMalformedRequest = "malformed-request" // a head the proxy refuses to read or to pass on (400, 505)
	ReasonHeadTooLong      = "head-too-long"     // a head over the size bound (431)
)

// Handler is what the front needs of the sidecar: it decides and serves the requests
// whose heads the front read, and logs and counts what the front refuses.
type Handler interface {
	// Connect serves a CONNECT: decided, refused or tunnelled. It reports whether the
	// tunnel took r's connection; if not, it has answered the client (or the client
	// went away) and the front closes the connection.
	Connect(r *Request, req *http.Request) bool
	// Forward begins any other request; the front then runs the Exchange.
	Forward(r *Request) Exchange
	// Refused counts and logs a head the front would not serve (of type typ, for
	// reason; host is what the head named, if it could be read; origin is the
	// original destination of a transparent connection, else zero).
	Refused(typ, reason, host, client string, origin netip.AddrPort)
	// Recovered logs and counts a panic the front recovered on one connection (a
	// request of type typ, "" if its head was not read yet).
	Recovered(typ, client string, p any)
}

// Exchange is one forwarded request as the sidecar serves it.
type Exchange interface {
	// Cancel and Recovered are the client-gone watch's (connio.Request).
	connio.Request
	// Serve answers req on w (goproxy). The front recovers a panic.
	Serve(w http.ResponseWriter, req *http.Request)
	// Relayed reports whether a relay (a websocket's) took the connection over.
	Relayed() bool
	// AnswerErr is the error that broke off the upstream's answer body, if any: the
	// front must not end that answer as if it were whole.
	AnswerErr() error
	// Report logs ev (with err, for UpstreamFailed) if the request was allowed.
	Report(ev Event, err error)
}

// Event is how a forwarded request ended short, for the sidecar's log.
type Event int

const (
	ClientGone         Event = iota // the client left while its request was served
	UpstreamFailed                  // the upstream's answer broke off before any of it was sent
	RequestBodyIdle                 // the client stopped sending its request body
	AnswerIdleUpstream              // the upstream stopped sending its answer
	AnswerIdleClient                // the client stopped reading its answer
)

// Request is what the front tells its Handler of one request besides its parsed head.
// The request's context is not req.Context(): attaching it to the request would copy
// the request.
type Request struct {
	Ctx    context.Context
	Cancel context.CancelFunc // ends Ctx: the drain's deadline reaches it too
	// Conn is the client's connection; a CONNECT's is handed over without the bound
	// of the front's writes.
	Conn   net.Conn
	Client string // Conn's remote address
	// Origin is the original destination of the transparent connection the request came
	// on, which alone it may go to (zero: a connection to the explicit proxy).
	Origin netip.AddrPort
	// Host is the request's first Host field as sent (HostSent: there was one), which
	// net/http drops from an absolute-form request.
	Host     string
	HostSent bool
	// Buffered are the bytes the client sent after a CONNECT's head, the tunnel's own
	// copy.
	Buffered []byte

	f    *Front
	cc   *clientConn
	body *requestBody // nil without one
	left atomic.Bool  // set by the client-gone watch, before it cancels the request
}

// Rearm makes end what the drain calls to end the request, in place of Cancel (a
// tunnel's set-up, which ends its dial too).
func (r *Request) Rearm(end context.CancelFunc) { r.f.waiting(r.Conn, end) }

// ClientLeft reports whether the client's connection ended while the request was
// served (connio.GoneWatch).
func (r *Request) ClientLeft() bool { return r.left.Load() }

// HasBody reports whether the request has a body (which the front bounds).
func (r *Request) HasBody() bool { return r.body != nil }

// StopBody ends the reads of the request's body unless it was read whole: the
// upstream connection it went to has ended.
func (r *Request) StopBody() {
	if r.body != nil && !r.body.done() {
		r.cc.in.stopBody(time.Now())
	}
}

// BodyFault says why the request's body failed through the client's doing: it was
// malformed (with the framing error), or the client ended the connection before its
// end.
func (r *Request) BodyFault() (malformed error, cutShort bool) {
	if r.body == nil {
		return nil, false
	}
	return r.body.clientFault()
}
