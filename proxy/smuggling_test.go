package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// recorder is an upstream that frames what it reads as strictly as RFC 9112 allows a
// recipient to, records every request it framed and every byte it read, and answers
// each request (keeping the connection, so the proxy pools it). The harness's upstreams
// are net/http servers, which would hide what bytes arrived: a desync shows in what a
// lenient upstream could make of the bytes, so the recorder judges the bytes themselves.
// A stream it cannot frame strictly is one a lenient upstream might frame otherwise.
type recorder struct {
	mu    sync.Mutex
	conns int
	raw   bytes.Buffer // every byte read since the last reset
	reqs  []recorded
	errs  []string // framing errors: bytes a strict upstream cannot frame as requests
}

type recorded struct {
	method, target string
	header         http.Header
	trailer        http.Header
	body           string
}

func (r *recorded) String() string {
	return fmt.Sprintf("%s %s %v body=%q trailer=%v", r.method, r.target, r.header, r.body, r.trailer)
}

// startRecorder serves a recorder on ip (127.0.0.2 is a.test's, 127.0.0.3 b.test's).
func startRecorder(t *testing.T, ip string) (*recorder, int) {
	rec := &recorder{}
	addr := serveTCP(t, ip, func(c net.Conn, _ <-chan struct{}) {
		rec.mu.Lock()
		rec.conns++
		rec.mu.Unlock()
		br := bufio.NewReader(io.TeeReader(c, recordWriter{rec}))
		for {
			req, err := readStrict(br)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
					rec.mu.Lock()
					rec.errs = append(rec.errs, err.Error())
					rec.mu.Unlock()
					_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
				}
				return
			}
			rec.mu.Lock()
			rec.reqs = append(rec.reqs, *req)
			rec.mu.Unlock()
			if _, err := io.WriteString(c, recorderAnswer(req)); err != nil || httpfront.HasToken(req.header.Get("Connection"), "close") {
				return
			}
		}
	})
	return rec, addr.Port
}

// recorderAnswer answers a framed request; the /ws paths refuse, ignore or fake an
// upgrade the way the backends of the websocket-smuggling write-ups do.
func recorderAnswer(req *recorded) string {
	status, extra := "200 OK", ""
	switch req.target {
	case "/ws426":
		status, extra = "426 Upgrade Required", "Sec-WebSocket-Version: 13\r\n"
	case "/ws101", "/ws101bare", "/ws101h2c":
		// A 101 (a websocket one, a bare one, one to h2c) after which the upstream
		// goes on reading HTTP/1.1 requests: a proxy that relays from here on passes
		// what the client sends next to it undecided.
		return map[string]string{
			"/ws101":     "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
			"/ws101bare": "HTTP/1.1 101 Switching Protocols\r\n\r\n",
			"/ws101h2c":  "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
		}[req.target]
	}
	body := fmt.Sprintf("seen host=%s target=%s body=%d", req.header.Get("Host"), req.target, len(req.body))
	return fmt.Sprintf("HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s", status, extra, len(body), body)
}

type recordWriter struct{ r *recorder }

func (w recordWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.raw.Write(p)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns, r.reqs, r.errs = 0, nil, nil
	r.raw.Reset()
}

func (r *recorder) seen() (conns int, raw string, reqs []recorded, errs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns, r.raw.String(), append([]recorded(nil), r.reqs...), append([]string(nil), r.errs...)
}

// readStrict reads one request as a strict RFC 9112 recipient: CRLF line ends, no
// control characters, no obs-fold, no whitespace before a colon, one Host, framing
// by exactly one of a plain-digits Content-Length or a Transfer-Encoding of chunked
// alone, chunk sizes of hex digits only, and no framing or routing field in trailers.
func readStrict(br *bufio.Reader) (*recorded, error) {
	line, err := readLine(br)
	if err != nil {
		return nil, err
	}
	parts := strings.Split(line, " ")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] != "HTTP/1.1" {
		return nil, fmt.Errorf("request line %q", line)
	}
	req := &recorded{method: parts[0], target: parts[1]}
	if req.header, err = readFields(br); err != nil {
		return nil, err
	}
	if len(req.header.Values("Host")) != 1 {
		return nil, fmt.Errorf("host fields %q", req.header.Values("Host"))
	}
	// A next hop that honours Connection drops the fields it lists (RFC 9110 §7.6.1):
	// listed framing or routing fields leave it to frame or route by guesswork.
	for _, v := range req.header.Values("Connection") {
		for _, f := range []string{"Host", "Content-Length", "Transfer-Encoding"} {
			if httpfront.HasToken(v, f) {
				return nil, fmt.Errorf("connection lists %s: %q", f, v)
			}
		}
	}
	te, cl := req.header.Values("Transfer-Encoding"), req.header.Values("Content-Length")
	switch {
	case len(te) > 0 && len(cl) > 0:
		return nil, fmt.Errorf("both Transfer-Encoding %q and Content-Length %q", te, cl)
	case len(te) > 0:
		if len(te) != 1 || te[0] != "chunked" {
			return nil, fmt.Errorf("transfer-encoding %q", te)
		}
		return req, readChunked(br, req)
	case len(cl) > 0:
		if len(cl) != 1 || strings.Trim(cl[0], "0123456789") != "" || cl[0] == "" {
			return nil, fmt.Errorf("content-length %q", cl)
		}
		n, err := strconv.ParseInt(cl[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("content-length %q: %v", cl, err)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return nil, err
		}
		req.body = string(body)
	}
	return req, nil
}

func readChunked(br *bufio.Reader, req *recorded) error {
	var body strings.Builder
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if line == "" || strings.Trim(strings.ToLower(line), "0123456789abcdef") != "" || len(line) > 8 {
			return fmt.Errorf("chunk size %q", line)
		}
		n, _ := strconv.ParseInt(line, 16, 64)
		if n == 0 {
			break
		}
		chunk := make([]byte, n+2)
		if _, err := io.ReadFull(br, chunk); err != nil {
			return err
		}
		if string(chunk[n:]) != "\r\n" {
			return fmt.Errorf("chunk of %d not followed by CRLF: %q", n, chunk[n:])
		}
		body.Write(chunk[:n])
	}
	req.body = body.String()
	trailer, err := readFields(br)
	if err != nil {
		return err
	}
	for _, k := range []string{"Host", "Content-Length", "Transfer-Encoding", "Connection"} {
		if len(trailer.Values(k)) > 0 {
			return fmt.Errorf("%s in trailer: %q", k, trailer.Values(k))
		}
	}
	req.trailer = trailer
	return nil
}

// readFields reads a field section through its empty line.
func readFields(br *bufio.Reader) (http.Header, error) {
	h := http.Header{}
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, err
		}
		if line == "" {
			return h, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("obs-fold line %q", line)
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("field line %q", line)
		}
		// A name a lenient upstream could take for a framing or routing field.
		norm := strings.ReplaceAll(strings.ToLower(name), "_", "-")
		for _, f := range []string{"host", "content-length", "transfer-encoding"} {
			if norm == f && strings.ToLower(name) != f {
				return nil, fmt.Errorf("field name %q looks like %s", name, f)
			}
		}
		h.Add(name, strings.Trim(value, " \t"))
	}
}

// readLine reads one CRLF-ended line without its CRLF; a bare LF, a CR or NUL
// elsewhere, or any other control character but HTAB is an error.
func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		if line != "" && errors.Is(err, io.EOF) {
			return "", io.ErrUnexpectedEOF
		}
		return "", err
	}
	if len(line) > 64<<10 {
		return "", fmt.Errorf("line of %d bytes", len(line))
	}
	if !strings.HasSuffix(line, "\r\n") {
		return "", fmt.Errorf("bare LF ends %q", line)
	}
	line = line[:len(line)-2]
	for _, c := range []byte(line) {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return "", fmt.Errorf("control character %#x in %q", c, line)
		}
	}
	return line, nil
}

// smuggleOut is what the client of one vector got back.
type smuggleOut struct {
	statuses []int
	bodies   []string
	egress   []string // X-Compass-Egress: the proxy's own answers say why
	rest     string   // bytes that did not parse as answers
}

// parseAnswers reads the answers in out; answers to HEAD requests are not expected.
func parseAnswers(out string) smuggleOut {
	var so smuggleOut
	br := bufio.NewReader(strings.NewReader(out))
	for {
		if _, err := br.Peek(1); err != nil {
			return so
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			rest, _ := io.ReadAll(br)
			so.rest = string(rest)
			return so
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		so.statuses = append(so.statuses, resp.StatusCode)
		so.bodies = append(so.bodies, string(body))
		so.egress = append(so.egress, resp.Header.Get("X-Compass-Egress"))
	}
}

// smuggleRig is the harness with a recorder at a.test's address (allowed on every
// port) and one at b.test's (denied): a shared server that also serves a denied host
// is the recorder at a.test's address asked for Host b.test.
type smuggleRig struct {
	h      *harness
	a, b   *recorder
	aHost  string // a.test:port of a's recorder
	bHost  string
	expand *strings.Replacer
}

func newSmuggleRig(t *testing.T) *smuggleRig {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	a, ap := startRecorder(t, "127.0.0.2")
	b, bp := startRecorder(t, "127.0.0.3")
	r := &smuggleRig{h: h, a: a, b: b, aHost: fmt.Sprintf("a.test:%d", ap), bHost: fmt.Sprintf("b.test:%d", bp)}
	r.expand = strings.NewReplacer("{A}", r.aHost, "{B}", r.bHost)
	return r
}

// send writes raw ({A} and {B} expanded) in one write, half-closes, and returns all
// the proxy answers until it closes.
func (r *smuggleRig) send(t *testing.T, raw string) string {
	t.Helper()
	c := r.h.dialProxy(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, r.expand.Replace(raw)); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	out, _ := io.ReadAll(c)
	return string(out)
}

// check asserts what must hold after any vector: b's recorder was never reached; every
// byte a's recorder read framed strictly as requests for a.test whose targets never
// carry the smuggled marker; and the client got only refusals or a's answers to
// requests for a.test. Then a next request, on the pooled upstream connection if one
// was kept, must get its own answer: a connection left out of step would answer it
// with a smuggled request's.
func (r *smuggleRig) check(t *testing.T, out string) {
	t.Helper()
	defer r.a.reset()
	defer r.b.reset()
	if conns, raw, _, _ := r.b.seen(); conns > 0 {
		t.Errorf("the denied upstream got %d connections, read %q", conns, raw)
	}
	_, raw, reqs, errs := r.a.seen()
	for _, e := range errs {
		t.Errorf("a.test's upstream could not frame what it got (%s); it read %q", e, raw)
	}
	for _, req := range reqs {
		if host := req.header.Get("Host"); host != r.aHost {
			t.Errorf("a.test's upstream got a request for %q: %s", host, &req)
		}
		if strings.Contains(req.target, "smuggled") {
			t.Errorf("a.test's upstream got the smuggled request: %s", &req)
		}
	}
	so := parseAnswers(out)
	for i, status := range so.statuses {
		switch {
		case strings.HasPrefix(so.bodies[i], "seen host="):
			if !strings.HasPrefix(so.bodies[i], "seen host="+r.aHost+" ") {
				t.Errorf("answer %d: %d %q", i, status, so.bodies[i])
			}
		case status == 400, status == 403, status == 411, status == 431, status == 501, status == 505:
		case status == 502 && so.egress[i] == "error; reason=client-gone":
			// A body cut short by the half-close: the upstream got no more than the
			// request's start.
		default:
			t.Errorf("answer %d: %d %q", i, status, so.bodies[i])
		}
	}
	if strings.Contains(so.rest, "seen host=") || strings.Contains(out, "smuggled body=") {
		t.Errorf("answer carries an upstream answer out of step: %q", out)
	}
	if logs := r.h.logs.String(); strings.Contains(logs, "panic") {
		t.Errorf("the proxy panicked: %s", logs)
	}
	if t.Failed() {
		t.Logf("client got %q", out)
		return
	}
	// One request per pool: the upstream client's (no body) and the Transport's.
	for _, next := range []struct{ req, answer string }{
		{"GET http://{A}/next HTTP/1.1\r\nHost: {A}\r\n\r\n", "target=/next body=0"},
		{"POST http://{A}/next HTTP/1.1\r\nHost: {A}\r\nContent-Length: 2\r\n\r\nhi", "target=/next body=2"},
	} {
		got := parseAnswers(r.send(t, next.req))
		if want := "seen host=" + r.aHost + " " + next.answer; len(got.bodies) != 1 || got.bodies[0] != want {
			t.Errorf("next request got %v %q, want its own answer", got.statuses, got.bodies)
		}
	}
}

// The smuggled requests: what a vector hides behind the request the proxy decides.
// smugAbs is one the proxy refuses (b.test is denied); smugOrigin is what the shared
// server at a.test's address would serve as b.test, were the bytes relayed raw.
const (
	smugAbs    = "GET http://{B}/smuggled HTTP/1.1\r\nHost: {B}\r\n\r\n"
	smugOrigin = "GET /smuggled HTTP/1.1\r\nHost: b.test\r\n\r\n"
)

// TestSmugglingVectors sends request-smuggling and desync vectors from public
// advisories of other proxies and servers. Whatever the proxy makes of each, nothing
// it did not decide may reach an upstream: no byte reaches the denied b.test, and the
// allowed upstream at a.test's address reads only requests for a.test, framed so that
// no upstream can frame them otherwise.
func TestSmugglingVectors(t *testing.T) {
	r := newSmuggleRig(t)
	post := "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\n"
	cl := func(s string) string { return fmt.Sprint(len(r.expand.Replace(s))) }
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(r.expand.Replace(s)), s) }
	inner := "GET http://{A}/smuggled HTTP/1.1\r\nHost: {A}\r\n\r\n" // allowed, but only as a body here
	cases := []struct {
		name string
		raw  string
	}{
		// Content-Length with Transfer-Encoding (RFC 9112 §6.3; PortSwigger "HTTP Desync Attacks", CL.TE and TE.CL).
		{"CL.TE: chunked body ends early, CL covers the smuggled request", post + "Content-Length: " + cl("0\r\n\r\n"+smugOrigin) + "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smugOrigin},
		{"TE.CL: CL ends early, chunked covers the smuggled request", post + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunk(smugOrigin) + "0\r\n\r\n"},
		{"TE.CL with an absolute smuggled request", post + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + chunk(smugAbs) + "0\r\n\r\n"},
		{"CL.TE on a GET", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smugAbs},
		// Two Content-Length values (RFC 9112 §6.3 item 5; ohler55/agoo#88).
		{"two Content-Length fields that differ", post + "Content-Length: 0\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"two Content-Length fields, larger first", post + "Content-Length: " + cl(smugOrigin) + "\r\nContent-Length: 0\r\n\r\n" + smugOrigin},
		{"Content-Length list of two values", post + "Content-Length: 0, " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"Content-Length list of equal values", post + "Content-Length: " + cl(smugOrigin) + ", " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"Content-Length with a plus sign", post + "Content-Length: +" + cl(smugOrigin) + "\r\n\r\n" + smugOrigin}, // hyper CVE-2021-32715
		{"Content-Length with a minus sign", post + "Content-Length: -1\r\n\r\n" + smugOrigin},                     // hyper CVE-2021-32715
		{"Content-Length with inner space", post + "Content-Length: 1 0\r\n\r\n" + smugOrigin},
		{"Content-Length with a tab before the value", post + "Content-Length:\t" + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"space before the colon of Content-Length", post + "Content-Length : " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin}, // Netty CVE-2019-16869
		{"Content-Length with leading zeros", post + "Content-Length: 000" + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"Content-Length in hex", post + "Content-Length: 0x10\r\n\r\n" + smugOrigin},
		{"Content-Length that overflows 64 bits", post + "Content-Length: 18446744073709551616\r\n\r\n" + smugOrigin},                        // HAProxy CVE-2021-40346
		{"Content-Length that overflows to a small value", post + "Content-Length: 18446744073709551617\r\n\r\n" + smugOrigin},               // HAProxy CVE-2021-40346
		{"Content-Length of 2^63", post + "Content-Length: 9223372036854775808\r\n\r\n" + smugOrigin},                                        // HAProxy CVE-2021-40346
		{"empty Content-Length", post + "Content-Length:\r\n\r\n" + smugAbs},                                                                 // HAProxy CVE-2023-40225
		{"empty Content-Length beside a valid one", post + "Content-Length:\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin}, // HAProxy CVE-2023-40225
		// Names with '_' map onto '-' in CGI/WSGI keys, which some servers frame by; nginx
		// (underscores_in_headers), Envoy (headers_with_underscores_action), gunicorn 22
		// and Waitress (src/waitress/parser.py) drop or refuse them for that reason.
		{"Content_Length with an underscore", post + "Content_Length: " + cl(smugOrigin) + "\r\n\r\n" + smugAbs},
		{"Transfer_Encoding with an underscore", post + "Transfer_Encoding: chunked\r\nContent-Length: " + cl("0\r\n\r\n"+smugAbs) + "\r\n\r\n0\r\n\r\n" + smugAbs},
		{"Transfer_Encoding on a GET", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nTransfer_Encoding: chunked\r\n\r\n" + smugAbs},

		// Transfer-Encoding variants (PortSwigger's TE.TE obfuscations).
		{"TE chunked, identity", post + "Transfer-Encoding: chunked, identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs}, // gunicorn CVE-2024-1135
		{"TE identity, chunked", post + "Transfer-Encoding: identity, chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs}, // Waitress CVE-2019-16786
		{"TE chunked, chunked", post + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n" + smugAbs},                        // Go CVE-2022-1705
		{"TE gzip, chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + smugAbs},                              // Waitress CVE-2019-16786
		{"TE with a leading space", post + "Transfer-Encoding:  chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs},
		{"TE with a vertical tab", post + "Transfer-Encoding:\x0bchunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs}, // HAProxy CVE-2019-18277
		{"TE xchunked", post + "Transfer-Encoding: xchunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs},
		{"TE chunkedx", post + "Transfer-Encoding: chunkedx\r\n\r\n0\r\n\r\n" + smugAbs},
		{"TE Chunked in another case", post + "Transfer-Encoding: Chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs},
		{"TE in two fields", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n" + smugAbs}, // gunicorn CVE-2024-1135
		{"TE in two fields, chunked last", post + "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smugAbs},
		{"empty TE", post + "Transfer-Encoding:\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs},
		{"space before the colon of TE", post + "Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs},           // Netty CVE-2019-16869
		{"control character after the TE name", post + "Transfer-Encoding\x0b: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs}, // Netty CVE-2021-43797
		{"TE on HTTP/1.0", "POST http://{A}/ HTTP/1.0\r\nHost: {A}\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(smugOrigin) + "0\r\n\r\n" + smugAbs},
		{"TE on HTTP/1.0 with keep-alive", "POST http://{A}/ HTTP/1.0\r\nHost: {A}\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs},

		// Chunked bodies.
		{"chunk extensions", post + "Transfer-Encoding: chunked\r\n\r\n5;a=1;b=\"x y\"\r\nhello\r\n0;c\r\n\r\n" + smugAbs},
		{"quoted chunk extension across a CRLF", post + "Transfer-Encoding: chunked\r\n\r\n5;ext=\"0\r\n\r\n\"\r\nhello\r\n0\r\n\r\n" + smugAbs},                                                   // squid CVE-2023-46846
		{"chunk extension ended by a bare LF", post + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x", len(r.expand.Replace(smugOrigin))) + ";\n0\r\n\r\n" + smugOrigin + "\r\n0\r\n\r\n"}, // Kestrel CVE-2025-55315
		{"chunk size with a space", post + "Transfer-Encoding: chunked\r\n\r\n5 ;x\r\nhello\r\n0\r\n\r\n" + smugAbs},                                                                               // squid CVE-2023-46846
		{"chunk size with a leading space", post + "Transfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n" + smugAbs},
		{"chunk size with trailing junk", post + "Transfer-Encoding: chunked\r\n\r\n1these-bytes\r\nZ\r\n0\r\n\r\n" + smugAbs}, // apache/trafficserver#10580
		{"chunk size 0x-prefixed", post + "Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n" + smugAbs},
		{"negative chunk size", post + "Transfer-Encoding: chunked\r\n\r\n-1\r\nhello\r\n0\r\n\r\n" + smugAbs},
		{"chunk size that overflows 64 bits", post + "Transfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n" + smugAbs},                     // hyper CVE-2021-32714
		{"overlong chunk size with leading zeros", post + "Transfer-Encoding: chunked\r\n\r\n" + strings.Repeat("0", 40) + "5\r\nhello\r\n0\r\n\r\n" + smugAbs}, // squid CVE-2024-25111
		{"bare LF after a chunk size", post + "Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n" + smugAbs},                                              // Go CVE-2025-22871
		{"bare LF after chunk data", post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n" + smugAbs},
		{"bare LF ends the last chunk", post + "Transfer-Encoding: chunked\r\n\r\n0\n\n" + smugAbs},
		{"chunk data without its CRLF", post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n" + smugAbs},
		{"chunk data longer than its size", post + "Transfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n" + smugAbs}, // graygnuorg/pound#43
		{"bare CR after a chunk size", post + "Transfer-Encoding: chunked\r\n\r\n5\rhello\r\n0\r\n\r\n" + smugAbs},
		// Framing and routing fields in a trailer (RFC 9110 §6.5.1; squid CVE-2023-46846).
		{"trailer with Host and Content-Length", post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nHost: {B}\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"declared trailer Host", post + "Trailer: Host\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nHost: {B}\r\n\r\n" + smugAbs},
		{"undeclared Host trailer beside a declared one", post + "Trailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\nHost: {B}\r\nContent-Length: 5\r\n\r\n" + smugAbs},
		{"declared trailers Content-Length and Transfer-Encoding", post + "Trailer: Content-Length, Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + smugAbs},
		{"trailer with an obs-fold line", post + "Trailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: a\r\n Host: {B}\r\n\r\n" + smugAbs},
		{"trailer ended by a bare LF", post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: a\n\n" + smugAbs},

		// Field syntax (RFC 9112 §5).
		{"obs-fold Host", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\n b.test\r\n\r\n"},
		{"obs-fold Host, first value empty", "GET http://{A}/ HTTP/1.1\r\nHost:\r\n {B}\r\n\r\n"},
		{"obs-fold line that reads as Host", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nX-A: a\r\n Host: {B}\r\n\r\n"},
		{"obs-fold Transfer-Encoding", post + "Transfer-Encoding: identity\r\n chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smugAbs}, // Node.js CVE-2022-32215
		{"obs-fold Content-Length", post + "Content-Length: 0\r\n " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"obs-fold first field line", "GET http://{A}/ HTTP/1.1\r\n Host: {B}\r\nHost: {A}\r\n\r\n"},
		{"space before the colon of Host", "GET http://{A}/ HTTP/1.1\r\nHost : {B}\r\nHost: {A}\r\n\r\n"}, // Netty CVE-2019-16869
		{"tab before the colon of Host", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nHost\t: {B}\r\n\r\n"},
		{"empty field name", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\n: {B}\r\n\r\n"},                                        // HAProxy CVE-2023-25725
		{"empty field name before Content-Length", post + ":\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin}, // HAProxy CVE-2023-25725
		{"NUL in a value", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nX-A: a\x00\r\nHost: {B}\r\n\r\n"},
		{"control character in a value", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nX-A: a\x01\x7fb\r\n\r\n"},
		{"control character in a value with a body", post + "X-A: a\x01b\r\nContent-Length: 2\r\n\r\nhi"},
		{"NUL in the Host value", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\x00{B}\r\n\r\n"},
		{"bare CR inside a value", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nX-A: a\rHost: {B}\r\n\r\n"},          // Node.js CVE-2023-30589
		{"bare CR in the request line", "GET http://{A}/\rGET http://{B}/smuggled HTTP/1.1\r\nHost: {A}\r\n\r\n"}, // Node.js CVE-2023-30589
		{"bare LF line ends in the head", "GET http://{A}/ HTTP/1.1\nHost: {A}\n\n" + smugAbs},                    // Waitress CVE-2019-16785
		{"bare LF in one field line", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\nHost: {B}\r\n\r\n"},                 // Node.js CVE-2022-35256
		{"CR CR LF line end", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\r\nHost: {B}\r\n\r\n"},
		{"head ended by LF CR LF", "POST http://{A}/ HTTP/1.1\r\nHost: {A}\r\nContent-Length: 0\n\r\n" + smugAbs},
		{"request behind a host mismatch", "GET http://{A}/ HTTP/1.1\r\nHost: {B}\r\n\r\nGET http://{A}/x HTTP/1.1\r\nHost: {A}\r\n\r\n"},
		{"HTTP/0.9 request", "GET /smuggled\r\n\r\n"},
		{"request behind a head too long", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nX-Pad: " + strings.Repeat("a", 70<<10) + "\r\n\r\n" + smugAbs},
		{"request behind a malformed request line", "GET http://{A}/ HTTP/1.1 x\r\nHost: {A}\r\n\r\n" + smugAbs},

		// Hop-by-hop abuse: fields the client lists in Connection (tinyproxy CVE-2023-49606;
		// Traefik CVE-2024-45410; Nathan Davison, "Abusing HTTP hop-by-hop request headers").
		{"Connection: Host", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nConnection: Host\r\n\r\n" + smugAbs},
		{"Connection: Host with a denied Host", "GET http://{A}/ HTTP/1.1\r\nHost: {B}\r\nConnection: Host\r\n\r\n"},
		{"Connection: Content-Length", post + "Connection: Content-Length\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"Connection: Transfer-Encoding", post + "Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(smugOrigin) + "0\r\n\r\n"},
		{"Connection: Transfer-Encoding, Content-Length", post + "Connection: Transfer-Encoding, Content-Length\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + chunk(smugOrigin) + "0\r\n\r\n"},
		{"Connection: close, Host, Content-Length", post + "Connection: close, Host, Content-Length\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"websocket upgrade listing Host in Connection", "GET http://{A}/ws426 HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade, Host\r\nUpgrade: websocket\r\n\r\n"},
		{"websocket upgrade listing framing fields in Connection", "GET http://{A}/ws426 HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade, Content-Length, Transfer-Encoding\r\nUpgrade: websocket\r\n\r\n"},
		{"Proxy-Connection: Content-Length", post + "Proxy-Connection: Content-Length\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},

		// Pipelining: the bytes after a request are its body to one side and a request to
		// the other unless both frame alike.
		{"request behind a GET with a body", "GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\nContent-Length: " + cl(smugAbs) + "\r\n\r\n" + smugAbs},
		{"request behind a POST of zero length", post + "Content-Length: 0\r\n\r\n" + smugAbs + smugOrigin},
		{"request behind a chunked POST", post + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smugAbs + smugOrigin},
		{"request behind a body short of its length", post + "Content-Length: 1000\r\n\r\n" + smugAbs},
		{"request in the body of a refused POST", "POST http://{B}/ HTTP/1.1\r\nHost: {B}\r\nContent-Length: " + cl(inner) + "\r\n\r\n" + inner}, // Apache httpd CVE-2022-22720
		{"request in the body of a refused chunked POST", "POST http://{B}/ HTTP/1.1\r\nHost: {B}\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(inner) + "0\r\n\r\n"},
		{"request in the body of a refused POST with Expect", "POST http://{B}/ HTTP/1.1\r\nHost: {B}\r\nExpect: 100-continue\r\nContent-Length: " + cl(inner) + "\r\n\r\n" + inner},
		{"requests behind allowed ones", "GET http://{A}/1 HTTP/1.1\r\nHost: {A}\r\n\r\nGET http://{A}/2 HTTP/1.1\r\nHost: {A}\r\n\r\n" + post + "Content-Length: 2\r\n\r\nhi" + smugAbs + smugOrigin},
		{"origin-form request behind an upgrade", "GET http://{A}/ws426 HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 1337\r\n\r\n" + smugOrigin}, // Apache httpd CVE-2019-17567
		{"request behind a refused upgrade", "GET http://{B}/ HTTP/1.1\r\nHost: {B}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + smugOrigin},
		{"upgrade with a body", "POST http://{A}/ws426 HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: " + cl(smugOrigin) + "\r\n\r\n" + smugOrigin},
		{"upgrade with a chunked body", "POST http://{A}/ws426 HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(smugOrigin) + "0\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := r.send(t, tc.raw)
			r.check(t, out)
			t.Logf("statuses %v", parseAnswers(out).statuses)
		})
	}
}

// TestWebsocketSmuggling: an upgrade the upstream does not agree to leaves the
// connection HTTP. Proxies that relay the connection raw once they saw the request
// (or any 101) let what the client sends next reach the upstream undecided: Apache
// httpd CVE-2019-17567 (mod_proxy_wstunnel), the 0ang3el/websocket-smuggling write-up
// (Varnish, Envoy, nginx with a 426 or a status the backend can be made to send).
// The client reads the answer before it sends the smuggled request, as the attack does.
func TestWebsocketSmuggling(t *testing.T) {
	r := newSmuggleRig(t)
	upgrade := "GET http://{A}%s HTTP/1.1\r\nHost: {A}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: %s\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	cases := []struct {
		name, request string
	}{
		{"upstream answers 426", fmt.Sprintf(upgrade, "/ws426", "1337")}, // 0ang3el/websocket-smuggling, variant 1
		{"upstream answers 200", fmt.Sprintf(upgrade, "/ws200", "13")},
		{"upstream answers a bare 101", fmt.Sprintf(upgrade, "/ws101bare", "13")}, // 0ang3el/websocket-smuggling, variant 2
		{"upstream answers 101 to h2c", fmt.Sprintf(upgrade, "/ws101h2c", "13")},
		// A websocket 101 to a request that asked for no upgrade.
		{"upstream answers an unasked-for websocket 101", "POST http://{A}/ws101 HTTP/1.1\r\nHost: {A}\r\nContent-Length: 0\r\n\r\n"},
	}
	for _, tc := range cases {
		for _, smug := range []string{smugOrigin, smugAbs} {
			t.Run(tc.name+" then "+firstLine(smug), func(t *testing.T) {
				c := r.h.dialProxy(t)
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.WriteString(c, r.expand.Replace(tc.request))
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode == http.StatusSwitchingProtocols {
					t.Errorf("the proxy relayed a %d upgrade as switched", resp.StatusCode)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				// The write may fail: the proxy closes a connection whose upgrade failed.
				_, _ = io.WriteString(c, r.expand.Replace(smug))
				_ = c.(*net.TCPConn).CloseWrite()
				rest, _ := io.ReadAll(br)
				// A relay would pass the bytes on after the client's side ended.
				time.Sleep(50 * time.Millisecond)
				r.check(t, string(rest))
			})
		}
	}
}
