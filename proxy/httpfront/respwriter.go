package httpfront

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

// responseWriter is the http.ResponseWriter of a request the front serves. It does what
// goproxy and the proxy's own answers need of net/http's: a status and headers written
// once, a body framed by the Content-Length the handler set, by chunks (HTTP/1.1) or by
// closing the connection (HTTP/1.0); informational answers; flushing; trailers; hijack.
type responseWriter struct {
	// mu orders the handler's writes against the "100 Continue" the upstream
	// transport's goroutine sends when it first reads the request body.
	mu   sync.Mutex
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	req  *http.Request

	header      http.Header
	status      int
	wroteHeader bool // the final status is set
	headSent    bool
	chunked     bool
	noBody      bool     // HEAD, 1xx, 204, 304: body bytes are dropped
	remaining   int64    // bytes the declared Content-Length still expects; -1 without one
	declared    []string // trailer fields the head announced
	closeAfter  bool     // the connection ends with this response
	hijacked    bool
	err         error // the first write error; every later write fails with it
}

var errBodyTooLong = errors.New("proxy: response body longer than its Content-Length")

var frontWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}

func newResponseWriter(c net.Conn, br *bufio.Reader, req *http.Request, closeAfter bool) *responseWriter {
	bw := frontWriters.Get().(*bufio.Writer)
	bw.Reset(c)
	return &responseWriter{conn: c, br: br, bw: bw, req: req, header: make(http.Header), remaining: -1, closeAfter: closeAfter}
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeader(code)
}

func (w *responseWriter) writeHeader(code int) {
	if w.hijacked || w.wroteHeader || code < 100 || code > 999 {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		// An informational answer goes out at once; the final one follows.
		w.writeStatusLine(code)
		_ = w.header.Write(w.bw)
		_, _ = w.bw.WriteString("\r\n")
		w.setErr(w.bw.Flush())
		return
	}
	w.wroteHeader, w.status = true, code
}

func (w *responseWriter) writeStatusLine(code int) {
	_, _ = w.bw.WriteString("HTTP/1.1 ")
	_, _ = w.bw.WriteString(strconv.Itoa(code))
	_ = w.bw.WriteByte(' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	_, _ = w.bw.WriteString(text)
	_, _ = w.bw.WriteString("\r\n")
}

// hopHeaders are the hop-by-hop fields (RFC 9110 §7.6.1) a proxy must not pass on; the
// framing and the connection's fate are this hop's own.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Transfer-Encoding", "Te", "Upgrade"}

// sendHead writes the status line and headers, choosing the body's framing.
func (w *responseWriter) sendHead() {
	if !w.wroteHeader {
		w.writeHeader(http.StatusOK)
	}
	w.headSent = true
	h, code := w.header, w.status
	upgrade := code == http.StatusSwitchingProtocols
	if !upgrade {
		delConnectionListed(h, "")
		for _, name := range hopHeaders {
			h.Del(name)
		}
	}
	bodyless := code < 200 || code == http.StatusNoContent || code == http.StatusNotModified
	switch cl := h.Get("Content-Length"); {
	case upgrade:
	case bodyless:
		w.noBody = true
		if code < 200 || code == http.StatusNoContent {
			h.Del("Content-Length")
		}
	case w.req.Method == http.MethodHead:
		w.noBody = true
	case cl != "":
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			h.Del("Content-Length")
			w.closeAfter = true
		} else {
			w.remaining = n
		}
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
		h.Set("Transfer-Encoding", "chunked")
		for _, v := range h.Values("Trailer") {
			for _, k := range strings.Split(v, ",") {
				if k = strings.TrimSpace(k); k != "" {
					w.declared = append(w.declared, http.CanonicalHeaderKey(k))
				}
			}
		}
	default:
		w.closeAfter = true
	}
	if w.closeAfter && !upgrade {
		h.Set("Connection", "close")
	}
	w.writeStatusLine(code)
	if trailers := w.trailerKeys(); len(trailers) > len(w.declared) {
		exclude := make(map[string]bool, len(trailers))
		for _, k := range trailers[len(w.declared):] {
			exclude[k] = true
		}
		_ = h.WriteSubset(w.bw, exclude)
	} else {
		_ = h.Write(w.bw)
	}
	_, _ = w.bw.WriteString("\r\n")
}

// trailerKeys are the header keys set with http.TrailerPrefix, which go after the body,
// and (once the head is out) those the head declared in its Trailer field.
func (w *responseWriter) trailerKeys() []string {
	keys := w.declared
	for k := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			keys = append(keys, k)
		}
	}
	return keys
}

func (w *responseWriter) setErr(err error) {
	if err != nil && w.err == nil {
		w.err = err
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.headSent {
		w.sendHead()
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody || len(p) == 0 {
		return len(p), nil
	}
	var tooLong error
	if w.remaining >= 0 {
		if int64(len(p)) > w.remaining {
			p, tooLong = p[:w.remaining], errBodyTooLong
		}
		w.remaining -= int64(len(p))
	}
	if w.chunked {
		_, _ = w.bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
		_, _ = w.bw.WriteString("\r\n")
	}
	n, err := w.bw.Write(p)
	if w.chunked && err == nil {
		_, err = w.bw.WriteString("\r\n")
	}
	w.setErr(err)
	if tooLong != nil {
		w.closeAfter = true
		return n, tooLong
	}
	return n, err
}

func (w *responseWriter) Flush() { _ = w.FlushError() }

func (w *responseWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hijacked {
		return http.ErrHijacked
	}
	if !w.headSent {
		w.sendHead()
	}
	w.setErr(w.bw.Flush())
	return w.err
}

// Hijack hands the connection over, after the head the handler already set (a 101).
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.wroteHeader && !w.headSent {
		w.sendHead()
	}
	if err := w.bw.Flush(); err != nil {
		return nil, nil, err
	}
	w.hijacked = true
	conn := w.conn
	if out, ok := conn.(*connio.IdleWriter); ok {
		conn = out.HandOver()
	}
	return conn, bufio.NewReadWriter(w.br, bufio.NewWriter(conn)), nil
}

// writeErr is the error that failed the answer's writes, if any.
func (w *responseWriter) writeErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// finish ends the response: the head if nothing was written (then the body is empty),
// the last chunk and the trailers, the flush. It reports whether the connection may
// carry another request.
func (w *responseWriter) finish() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hijacked {
		return false
	}
	if !w.headSent {
		if !w.wroteHeader {
			w.writeHeader(http.StatusOK)
		}
		// Not for a HEAD's or a 304's: their Content-Length is that of the body a GET's
		// 200 would carry (RFC 9110, 8.6), which only the upstream knows.
		if w.header.Get("Content-Length") == "" && w.req.Method != http.MethodHead && w.status != http.StatusNotModified {
			w.header.Set("Content-Length", "0")
		}
		w.sendHead()
	}
	if w.chunked && w.err == nil {
		_, _ = w.bw.WriteString("0\r\n")
		trailers := make(http.Header)
		for _, k := range w.trailerKeys() {
			trailers[strings.TrimPrefix(k, http.TrailerPrefix)] = w.header[k]
		}
		// The proxy's own field never comes after a body: this one is an upstream's.
		trailers.Del("X-Compass-Egress")
		_ = trailers.Write(w.bw)
		_, _ = w.bw.WriteString("\r\n")
	}
	w.setErr(w.bw.Flush())
	w.bw.Reset(nil)
	frontWriters.Put(w.bw)
	w.bw = nil
	if w.remaining > 0 {
		w.closeAfter = true // the body fell short of its length: the client must see the end
	}
	if w.status == http.StatusSwitchingProtocols {
		// Switched to a protocol nobody relayed: whatever the upstream sent after the
		// 101 went out as if it were HTTP, and the connection cannot carry HTTP again.
		w.closeAfter = true
	}
	return w.err == nil && !w.closeAfter
}

// replaceUnsent writes answer (a whole response that ends the connection) in place of
// a response nothing of which has reached the client, and reports whether it did.
// Nothing may wait in the buffer either: a panic can stop an informational answer
// part-way through its head.
func (w *responseWriter) replaceUnsent(answer string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.headSent || w.hijacked || w.bw == nil || w.bw.Buffered() > 0 {
		return false
	}
	w.headSent = true
	_, _ = w.bw.WriteString(answer)
	w.setErr(w.bw.Flush())
	return true
}

// sendContinue answers "100 Continue" unless the response has begun or ended.
func (w *responseWriter) sendContinue() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wroteHeader || w.headSent || w.hijacked || w.bw == nil {
		return
	}
	_, _ = w.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	w.setErr(w.bw.Flush())
}
