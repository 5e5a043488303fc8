package httpfront

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// MaxHeadBytes bounds a request head (what net/http's server allows with our
// MaxHeaderBytes of 64 KiB, including its 4 KiB of slack).
const MaxHeadBytes = 64<<10 + 4096

// MaxHeadFields bounds the field lines of a head, a request's or an upstream's answer's
// (Apache and HAProxy allow about 100). Parsed, a head of tiny fields costs about
// thirty times its size, held while its request is served: 64 KiB of them took some
// 1 MiB of heap, a 10 MiB answer head of them 280 MiB.
const MaxHeadFields = 256

// FieldCount is the number of field lines h was read from.
func FieldCount(h http.Header) int {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	return n
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

// HasToken reports whether the comma-separated list v names token (any case).
func HasToken(v, token string) bool {
	for _, f := range strings.Split(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// DropConnectionFields removes the fields a request's Connection field lists: they are
// for this hop alone (RFC 9110, 7.6.1), and a server behind the proxy that honoured the
// list would drop fields the decision read (Host) or that frame the request. A
// websocket handshake keeps its Upgrade and goes on with Connection: Upgrade alone;
// goproxy removes the Connection field of every other request.
//
// Keep-Alive and TE are this hop's whether listed or not (RFC 9110, 7.6.1): a TE
// passed on lets the upstream frame its answer in a transfer coding the proxy cannot
// read. Of TE only "trailers" goes on, as the client's own word that it takes them.
func DropConnectionFields(h http.Header) {
	delete(h, "Keep-Alive")
	if te, ok := h["Te"]; ok {
		delete(h, "Te")
		if httpguts.HeaderValuesContainsToken(te, "trailers") {
			h["Te"] = []string{"trailers"}
		}
	}
	if len(h["Connection"]) == 0 {
		return
	}
	websocket := IsWebsocketUpgrade(h)
	keep := ""
	if websocket {
		keep = "upgrade"
	}
	delConnectionListed(h, keep)
	if websocket {
		h.Set("Connection", "Upgrade")
	}
}

// delConnectionListed deletes the fields that h's Connection fields list, all but keep
// (any case; "" keeps none): the one reading of the list, for requests
// (DropConnectionFields) and answers (sendHead).
func delConnectionListed(h http.Header, keep string) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" && !strings.EqualFold(name, keep) {
				h.Del(name)
			}
		}
	}
}

// IsWebsocketUpgrade reports whether h asks for, or agrees to, a websocket upgrade.
func IsWebsocketUpgrade(h http.Header) bool {
	connectionUpgrade := false
	for _, v := range h.Values("Connection") {
		connectionUpgrade = connectionUpgrade || HasToken(v, "upgrade")
	}
	return connectionUpgrade && UpgradesToWebsocket(h)
}

// UpgradesToWebsocket reports whether h's Upgrade fields name exactly one protocol,
// websocket. A list ("websocket, h2c") or a second field would let the upstream pick a
// protocol the proxy does not relay as a websocket.
func UpgradesToWebsocket(h http.Header) bool {
	v := h.Values("Upgrade")
	return len(v) == 1 && strings.EqualFold(textproto.TrimString(v[0]), "websocket")
}

// ErrorAnswer is the proxy's own failure (not a policy refusal): an empty answer whose
// X-Compass-Egress header names the reason, after which the connection closes.
func ErrorAnswer(status, reason string) string {
	return "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nX-Compass-Egress: error; reason=" +
		reason + "\r\nContent-Length: 0\r\n\r\n"
}

var drainingAnswer = ErrorAnswer("503 Service Unavailable", "draining")

func plainAnswer(status string) string {
	return "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		fmt.Sprint(len(status)) + "\r\n\r\n" + status
}
