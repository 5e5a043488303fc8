package httpfront

import (
	"errors"
	"net/http"
	"time"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// serveRequest runs the Handler's exchange of one request and finishes its response.
// keep says the connection may carry another request; hijacked that the exchange took
// it over.
func (f *Front) serveRequest(cc *clientConn, r *Request, req *http.Request) (keep, hijacked bool) {
	// A request that asked for an upgrade ends its connection unless it was upgraded:
	// what the client sent after it may be meant for the upgraded protocol.
	closeAfter := req.Close || !req.ProtoAtLeast(1, 1) || f.draining() || req.Header.Get("Upgrade") != ""
	w := newResponseWriter(&cc.out, cc.br, req, closeAfter)
	f.startBody(cc, r, req, w)
	ex := f.h.Forward(r)
	// The watch reads the connection, so not while a body or an upgrade may; nor
	// behind a next request already read, which says the client is there and whose
	// connection's end belongs to that request.
	watch := r.body == nil && req.Header.Get("Upgrade") == "" && cc.br.Buffered() == 0
	if watch {
		cc.gone.Arm(cc.c, ex, f.cfg.ClientWatchDelay, &r.left)
	}
	panicked := f.runExchange(ex, w, req, cc.remote)
	if watch {
		cc.in.pre = cc.gone.Stop()
	}
	left := r.left.Load()
	if left {
		ex.Report(ClientGone, nil)
	}
	// A connection handed over is the relay's, which the exchange closed if it
	// panicked; one a panic stopped between the hand-over and the relay is nobody's,
	// and closes here.
	if w.hijacked && (!panicked || ex.Relayed()) {
		return false, true
	}
	keep = f.finishAnswer(cc, r, ex, w, panicked, left)
	if r.body == nil {
		return keep, false
	}
	return f.endBody(cc, r.body, keep), false
}

// startBody has the body of req, a request of cc's that w answers, read under the idle
// bound. A request without a body keeps http.NoBody: anything else makes the transport
// probe for a body on a goroutine of its own.
func (f *Front) startBody(cc *clientConn, r *Request, req *http.Request, w *responseWriter) {
	if req.Body == http.NoBody {
		return
	}
	cc.in.startBody(f.cfg.TunnelIdleTimeout)
	r.body = newRequestBody(req)
	if req.ProtoAtLeast(1, 1) && HasToken(req.Header.Get("Expect"), "100-continue") {
		r.body.beforeRead = w.sendContinue
	}
	req.Body = r.body
}

// runExchange serves req through ex and reports whether it panicked, which it recovers.
func (f *Front) runExchange(ex Exchange, w *responseWriter, req *http.Request, client string) (panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			f.h.Recovered(TypeHTTP, client, p)
			panicked = true
		}
	}()
	ex.Serve(w, req)
	return false
}

// finishAnswer ends the answer w wrote to r, which ex served (unless it panicked) and
// whose client may have left, and reports whether the connection may carry another
// request.
func (f *Front) finishAnswer(cc *clientConn, r *Request, ex Exchange, w *responseWriter, panicked, left bool) (keep bool) {
	if panicked {
		// Nothing of a response has gone out, not even part of a head: the client
		// is told the proxy failed, in an answer no destination sends.
		w.replaceUnsent(ErrorAnswer("500 Internal Server Error", "internal-error"))
	}
	// The head of an answer is held until its body's first bytes: one whose body broke
	// off before any (the upstream closed right after its head) has sent the client
	// nothing, which is still the proxy's to answer rather than leave it a bare close.
	answerErr := ex.AnswerErr()
	if answerErr != nil {
		status, reason := "502 Bad Gateway", "upstream-failed"
		if errors.Is(answerErr, connio.ErrUpstreamIdle) {
			status, reason = "504 Gateway Timeout", "upstream-timeout"
		}
		if w.replaceUnsent(ErrorAnswer(status, reason)) && reason == "upstream-failed" {
			ex.Report(UpstreamFailed, answerErr)
		}
	}
	// An answer whose upstream body broke off ends with the connection, never with
	// the framing of a whole one (a last chunk, a kept connection); so does a request
	// whose client stopped sending its body, unanswered.
	bodyIdle := r.body != nil && cc.in.bodyIdle()
	keep = !panicked && !left && answerErr == nil && !bodyIdle && w.finish()
	if !keep {
		switch {
		case bodyIdle:
			ex.Report(RequestBodyIdle, nil)
		case errors.Is(answerErr, connio.ErrUpstreamIdle):
			ex.Report(AnswerIdleUpstream, nil)
		case errors.Is(w.writeErr(), connio.ErrClientIdle):
			ex.Report(AnswerIdleClient, nil)
		}
	}
	return keep
}

// endBody ends the request body of cc's request and reports whether the connection
// may carry another request (keep, and the body read to its end). The body reads the
// connection's reader, which the next request (or the pool) gets next: it is ended
// first. A transport goroutine may be in a read of it; the deadline bounds that read,
// and the discard of what nobody read.
func (f *Front) endBody(cc *clientConn, body *requestBody, keep bool) bool {
	defer cc.in.endBody()
	if keep {
		if !body.done() {
			cc.in.stopBody(time.Now().Add(LingerTime))
		}
		return body.end(maxDrainBytes)
	}
	cc.in.stopBody(time.Now())
	body.end(0)
	return false
}
