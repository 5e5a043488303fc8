package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// A head a server behind the proxy could frame otherwise is refused before anything
// leaves, with an answer that names the field and the rule; a body the client breaks
// is answered as the client's fault, never logged as the upstream's.
func TestRequestFramingIsTheClientsFault(t *testing.T) {
	r := newSmuggleRig(t)
	post := "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\n"
	for _, tc := range []struct {
		name, raw string
		status    int
		egress    string // X-Compass-Egress of the answer
		text      string // in the answer's body
		reached   bool   // the request's head reached the upstream
	}{
		{"space before the colon", post + "Content-Length : 2\r\n\r\nhi",
			400, "", `header field name "Content-Length " is not a token`, false},
		{"Transfer_Encoding", post + "Transfer_Encoding: chunked\r\nContent-Length: 2\r\n\r\nhi",
			400, "", `header field name "Transfer_encoding" reads as Transfer-Encoding`, false},
		{"Content_Length on a GET", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nContent_Length: 5\r\n\r\n",
			400, "", `reads as Content-Length`, false},
		{"Content-Length with Transfer-Encoding", post + "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
			400, "", "Content-Length with Transfer-Encoding", false},
		{"malformed chunk size", post + "Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n\r\n",
			400, "error; reason=bad-request-body", "malformed request body", true},
		{"body cut short", post + "Content-Length: 10\r\n\r\nhi",
			502, "error; reason=client-gone", "before the body's end", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer r.a.reset()
			logged := len(r.h.logs.String())
			got := parseAnswers(r.send(t, tc.raw))
			if len(got.statuses) != 1 || got.statuses[0] != tc.status || got.egress[0] != tc.egress || !strings.Contains(got.bodies[0], tc.text) {
				t.Fatalf("answers %v %q %q, want one %d %q saying %q", got.statuses, got.egress, got.bodies, tc.status, tc.egress, tc.text)
			}
			if conns, raw, _, _ := r.a.seen(); !tc.reached && conns > 0 {
				t.Errorf("the upstream got %q", raw)
			}
			if logs := r.h.logs.String()[logged:]; strings.Contains(logs, `"upstream failed"`) {
				t.Errorf("the client's fault was logged as the upstream's:\n%s", logs)
			}
		})
	}
}

// Fields the client's Connection lists stop at the proxy (RFC 9110, 7.6.1), a websocket
// handshake going on with Connection: Upgrade alone; of a trailer only the fields the
// client announced go on, and never one that frames or routes a request.
func TestHopAndTrailerFieldsStopHere(t *testing.T) {
	r := newSmuggleRig(t)
	for _, tc := range []struct {
		name, raw  string
		connection string // the Connection field the upstream gets
		trailer    string // the trailer fields it gets, sorted
		te         string // the TE field it gets
	}{
		{"listed field", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nConnection: X-Hop, Keep-Alive\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n\r\n", "", "", ""},
		{"websocket handshake", "GET http://{A}/ws426 HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade, X-Hop\r\nUpgrade: websocket\r\nX-Hop: 1\r\n\r\n", "Upgrade", "", ""},
		{"trailer", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nTrailer: X-T, Host\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"2\r\nhi\r\n0\r\nX-T: 1\r\nX-Unannounced: 2\r\nHost: b.test\r\n\r\n", "", "X-T", ""},
		// Keep-Alive and TE are this hop's whether the Connection field lists them or
		// not; a TE that offers the upstream a transfer coding gets an answer framed in
		// it, which the proxy cannot read. Both upstream clients: with and without a body.
		{"unlisted Keep-Alive and TE", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nKeep-Alive: 5\r\nTE: gzip\r\n\r\n", "", "", ""},
		{"unlisted Keep-Alive and TE, with a body", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nKeep-Alive: 5\r\nTE: gzip;q=1\r\nContent-Length: 2\r\n\r\nhi", "", "", ""},
		{"TE trailers", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nTE: gzip, Trailers\r\n\r\n", "", "", "trailers"},
		// A trailer of more fields than a head may have goes whole (RFC 9110, 6.5.1: a
		// recipient may discard it): it would hold the memory the head's bound saves.
		{"trailer of more fields than a head may have", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nTrailer: " + trailerNames(maxHeadFields+1) +
			"\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n" + trailerFields(maxHeadFields+1) + "\r\n", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer r.a.reset()
			r.send(t, tc.raw)
			_, _, reqs, _ := r.a.seen()
			if len(reqs) != 1 {
				t.Fatalf("the upstream got %d requests, want 1", len(reqs))
			}
			got := reqs[0]
			if got.header.Get("X-Hop") != "" || got.header.Get("Keep-Alive") != "" {
				t.Errorf("a hop-by-hop field went on: %v", got.header)
			}
			if te := strings.Join(got.header.Values("Te"), ","); te != tc.te {
				t.Errorf("TE %q, want %q", te, tc.te)
			}
			if c := got.header.Get("Connection"); c != tc.connection {
				t.Errorf("Connection %q, want %q", c, tc.connection)
			}
			var trailer []string
			for k := range got.trailer {
				trailer = append(trailer, k)
			}
			if strings.Join(trailer, ",") != tc.trailer {
				t.Errorf("trailer %v, want %q", got.trailer, tc.trailer)
			}
		})
	}
}

// TestUserAgentIsTheClients: the upstream gets the client's User-Agent field as sent,
// or none when it sent none, never net/http's own, over both upstream clients.
func TestUserAgentIsTheClients(t *testing.T) {
	r := newSmuggleRig(t)
	for _, tc := range []struct{ name, raw, ua string }{
		{"none", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\n\r\n", "[]"},
		{"none, with a body", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nContent-Length: 2\r\n\r\nhi", "[]"},
		{"the client's", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nUser-Agent: agent/1\r\n\r\n", `["agent/1"]`},
		{"the client's, with a body", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nUser-Agent: agent/1\r\nContent-Length: 2\r\n\r\nhi", `["agent/1"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer r.a.reset()
			r.send(t, tc.raw)
			_, _, reqs, _ := r.a.seen()
			if len(reqs) != 1 {
				t.Fatalf("the upstream got %d requests, want 1", len(reqs))
			}
			if ua := fmt.Sprintf("%q", reqs[0].header.Values("User-Agent")); ua != tc.ua {
				t.Errorf("User-Agent fields %s, want %s", ua, tc.ua)
			}
		})
	}
}

// trailerNames lists n trailer field names for a Trailer field; trailerFields sends them.
func trailerNames(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("X-T%d", i)
	}
	return strings.Join(names, ", ")
}

func trailerFields(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-T%d: v\r\n", i)
	}
	return b.String()
}
