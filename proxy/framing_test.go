package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/httpfront"
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
		{"trailer of more fields than a head may have", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nTrailer: " + trailerNames(httpfront.MaxHeadFields+1) +
			"\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n" + trailerFields(httpfront.MaxHeadFields+1) + "\r\n", "", "", ""},
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

// startFramingUpstream serves responses of every framing on 127.0.0.2 (a.test).
func startFramingUpstream(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/length", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		io.WriteString(w, "hello")
	})
	mux.HandleFunc("/chunks", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "one,")
		w.(http.Flusher).Flush()
		io.WriteString(w, "two")
	})
	mux.HandleFunc("/trailer", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "42")
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/notmodified", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotModified) })
	mux.HandleFunc("/hop", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Secret")
		w.Header().Set("X-Secret", "hop-by-hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("/reqframe", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%v %d %q", r.TransferEncoding, r.ContentLength, b)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %q", b)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// TestResponseFraming: the front's response writer passes on every framing an upstream
// uses, drops hop-by-hop fields, forwards trailers, and keeps the connection for the
// next request.
func TestResponseFraming(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := startFramingUpstream(t)
	base := fmt.Sprintf("http://a.test:%d", port)
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
		check        func(t *testing.T, resp *http.Response)
	}{
		{"GET", "/length", 200, "hello", func(t *testing.T, resp *http.Response) {
			if resp.ContentLength != 5 {
				t.Errorf("content length %d", resp.ContentLength)
			}
		}},
		{"GET", "/chunks", 200, "one,two", func(t *testing.T, resp *http.Response) {
			if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
				t.Errorf("transfer encoding %v", resp.TransferEncoding)
			}
		}},
		{"GET", "/trailer", 200, "body", func(t *testing.T, resp *http.Response) {
			if got := resp.Trailer.Get("X-Sum"); got != "42" {
				t.Errorf("trailer X-Sum %q", got)
			}
		}},
		{"HEAD", "/length", 200, "", func(t *testing.T, resp *http.Response) {
			if resp.ContentLength != 5 {
				t.Errorf("HEAD content length %d", resp.ContentLength)
			}
		}},
		{"GET", "/nocontent", 204, "", nil},
		{"GET", "/notmodified", 304, "", nil},
		{"GET", "/hop", 200, "ok", func(t *testing.T, resp *http.Response) {
			for _, k := range []string{"X-Secret", "Keep-Alive"} {
				if v := resp.Header.Get(k); v != "" {
					t.Errorf("hop-by-hop %s passed on: %q", k, v)
				}
			}
		}},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			for i := range 2 {
				reused := false
				trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}
				req, _ := http.NewRequest(tc.method, base+tc.path, nil)
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
				resp, err := h.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != tc.status || string(body) != tc.body {
					t.Fatalf("got %d %q %v, want %d %q", resp.StatusCode, body, err, tc.status, tc.body)
				}
				if tc.check != nil {
					tc.check(t, resp)
				}
				if i == 1 && !reused {
					t.Errorf("the second request did not reuse the connection")
				}
			}
		})
	}
}

// TestExpectContinue: a client that waits for "100 Continue" before its body gets it
// once the body is wanted, then the final answer.
func TestExpectContinue(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := startFramingUpstream(t)
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST http://a.test:%d/echo HTTP/1.1\r\nHost: a.test:%d\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("first answer %q %v, want 100 Continue", line, err)
	}
	if blank, _ := br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("100 Continue not followed by a blank line: %q", blank)
	}
	io.WriteString(c, "data")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != `got "data"` {
		t.Fatalf("final answer %d %q", resp.StatusCode, body)
	}
}

// TestHTTP10Client: an HTTP/1.0 client gets its answer delimited by the close.
func TestHTTP10Client(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := startFramingUpstream(t)
	out := h.raw(fmt.Sprintf("GET http://a.test:%d/chunks HTTP/1.0\r\n\r\n", port))
	if !strings.HasPrefix(out, "HTTP/1.1 200 ") || !strings.Contains(out, "Connection: close\r\n") || !strings.HasSuffix(out, "\r\n\r\none,two") {
		t.Fatalf("answer to HTTP/1.0: %q", out)
	}
}

// TestRequestFramingUpstream: a request reaches the upstream framed as the client
// framed it, whichever upstream client carries it: no body stays no body, a length
// stays a length, chunks stay chunks.
func TestRequestFramingUpstream(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	port := startFramingUpstream(t)
	for _, tc := range []struct{ name, req, want string }{
		{"no body", "GET http://a.test:%d/reqframe HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", `[] 0 ""`},
		{"length", "POST http://a.test:%d/reqframe HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", `[] 3 "abc"`},
		{"chunks", "POST http://a.test:%d/reqframe HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n", `[chunked] -1 "abc"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := h.raw(fmt.Sprintf(tc.req, port))
			if !strings.HasPrefix(out, "HTTP/1.1 200 ") || !strings.Contains(out, tc.want) {
				t.Fatalf("answer %q, want a body with %q", out, tc.want)
			}
		})
	}
}
