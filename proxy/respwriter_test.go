package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

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

// bufConn is a net.Conn whose writes land in a buffer.
type bufConn struct {
	net.Conn
	out bytes.Buffer
}

func (c *bufConn) Write(p []byte) (int, error) { return c.out.Write(p) }

// TestResponseWriterFraming drives the front's response writer the way goproxy and the
// proxy's own answers do and checks the bytes on the wire.
func TestResponseWriterFraming(t *testing.T) {
	for _, tc := range []struct {
		name     string
		method   string
		proto    int // minor version of HTTP/1.x
		write    func(w *responseWriter) error
		want     string // the exact bytes
		keep     bool
		closeErr error // the error the last write must return
	}{
		{"length", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "2")
			_, err := w.Write([]byte("ok"))
			return err
		}, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, nil},
		{"chunked when the length is unknown", "GET", 1, func(w *responseWriter) error {
			w.Write([]byte("ab"))
			_, err := w.Write([]byte("c"))
			return err
		}, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n", true, nil},
		{"close-delimited for HTTP/1.0", "GET", 0, func(w *responseWriter) error {
			_, err := w.Write([]byte("abc"))
			return err
		}, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", false, nil},
		{"nothing written: empty body of length 0", "GET", 1, func(w *responseWriter) error {
			w.WriteHeader(http.StatusForbidden)
			return nil
		}, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", true, nil},
		{"HEAD keeps the length and drops the body", "HEAD", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "5")
			_, err := w.Write([]byte("hello"))
			return err
		}, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true, nil},
		{"204 has no length and no body", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "3")
			w.WriteHeader(http.StatusNoContent)
			_, err := w.Write([]byte("abc"))
			return err
		}, "HTTP/1.1 204 No Content\r\n\r\n", true, nil},
		{"informational answer before the final one", "GET", 1, func(w *responseWriter) error {
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Length", "1")
			_, err := w.Write([]byte("x"))
			return err
		}, "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", true, nil},
		{"body longer than its length is cut and closes", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "2")
			_, err := w.Write([]byte("abc"))
			return err
		}, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab", false, errBodyTooLong},
		{"body shorter than its length closes", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "5")
			_, err := w.Write([]byte("abc"))
			return err
		}, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", false, nil},
		{"invalid length: close-delimited", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "-1")
			_, err := w.Write([]byte("abc"))
			return err
		}, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", false, nil},
		{"hop-by-hop fields dropped", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Connection", "keep-alive, X-Hop")
			w.Header().Set("X-Hop", "1")
			w.Header().Set("Keep-Alive", "timeout=5")
			w.Header().Set("Proxy-Connection", "keep-alive")
			w.Header().Set("Upgrade", "h2c")
			w.Header().Set("Content-Length", "0")
			return nil
		}, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true, nil},
		{"trailers after the last chunk", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Trailer", "X-Sum")
			_, err := w.Write([]byte("ab"))
			w.Header().Set("X-Sum", "3")
			w.Header().Set(http.TrailerPrefix+"X-Late", "4")
			return err
		}, "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nX-Late: 4\r\nX-Sum: 3\r\n\r\n", true, nil},
		{"status without a text", "GET", 1, func(w *responseWriter) error {
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(599)
			return nil
		}, "HTTP/1.1 599 status code 599\r\nContent-Length: 0\r\n\r\n", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &bufConn{}
			req := &http.Request{Method: tc.method, ProtoMajor: 1, ProtoMinor: tc.proto}
			w := newResponseWriter(c, bufio.NewReader(strings.NewReader("")), req, tc.proto == 0)
			err := tc.write(w)
			if !errors.Is(err, tc.closeErr) {
				t.Errorf("last write: %v, want %v", err, tc.closeErr)
			}
			keep := w.finish()
			if got := c.out.String(); got != tc.want {
				t.Errorf("wire:\n got %q\nwant %q", got, tc.want)
			}
			if keep != tc.keep {
				t.Errorf("keep-alive %v, want %v", keep, tc.keep)
			}
		})
	}
}

// TestResponseWriterContinue: "100 Continue" goes out only before the answer begins.
func TestResponseWriterContinue(t *testing.T) {
	c := &bufConn{}
	w := newResponseWriter(c, bufio.NewReader(strings.NewReader("")), &http.Request{Method: "POST", ProtoMajor: 1, ProtoMinor: 1}, false)
	w.sendContinue()
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
	w.sendContinue()
	w.finish()
	w.sendContinue()
	if want := "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"; c.out.String() != want {
		t.Fatalf("wire %q, want %q", c.out.String(), want)
	}
}
