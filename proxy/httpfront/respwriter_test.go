package httpfront

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
)

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
