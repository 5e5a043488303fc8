package httpfront

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// FuzzResponseWriterFraming: whatever a handler does with the front's response writer
// (status, declared length, body writes, HEAD or not, HTTP/1.0 or 1.1), an answer on a
// connection that stays open is self-delimiting: a client reads it and its body and
// finds nothing left over, which is what keeps the next answer on the connection in
// step. Its body is what the handler wrote when the status allows one.
func FuzzResponseWriterFraming(f *testing.F) {
	f.Add(200, "GET", true, -1, []byte("hello"), uint8(2))
	f.Add(204, "GET", true, 3, []byte("abc"), uint8(1))
	f.Add(200, "HEAD", true, 5, []byte("hello"), uint8(1))
	f.Add(200, "GET", false, -1, []byte("abc"), uint8(3))
	f.Add(200, "GET", true, 2, []byte("abc"), uint8(1))
	f.Add(103, "GET", true, 1, []byte("x"), uint8(1))
	f.Add(304, "GET", true, -1, []byte(""), uint8(0))
	f.Fuzz(func(t *testing.T, status int, method string, http11 bool, length int, body []byte, parts uint8) {
		if status < 100 || status > 599 || (method != "GET" && method != "HEAD") {
			return
		}
		minor := 0
		if http11 {
			minor = 1
		}
		c := &bufConn{}
		req := &http.Request{Method: method, ProtoMajor: 1, ProtoMinor: minor}
		w := newResponseWriter(c, bufio.NewReader(strings.NewReader("")), req, !http11)
		if length >= 0 {
			w.Header().Set("Content-Length", strconv.Itoa(length))
		}
		w.WriteHeader(status)
		n := max(int(parts), 1)
		for i := range n {
			lo, hi := len(body)*i/n, len(body)*(i+1)/n
			if _, err := w.Write(body[lo:hi]); err != nil {
				break
			}
		}
		if !w.finish() {
			return // the connection closes: the close delimits the answer
		}
		br := bufio.NewReader(bytes.NewReader(c.out.Bytes()))
		var resp *http.Response
		for {
			var err error
			if resp, err = http.ReadResponse(br, req); err != nil {
				t.Fatalf("unreadable answer %q: %v", c.out.Bytes(), err)
			}
			if resp.StatusCode >= 200 {
				break
			}
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("body of %q: %v", c.out.Bytes(), err)
		}
		if rest, _ := io.ReadAll(br); len(rest) != 0 {
			t.Fatalf("answer %q leaves %q after its end", c.out.Bytes(), rest)
		}
		bodyless := method == "HEAD" || resp.StatusCode == 204 || resp.StatusCode == 304
		if !bodyless && !bytes.Equal(got, body) {
			t.Fatalf("answer %q carries body %q, the handler wrote %q", c.out.Bytes(), got, body)
		}
	})
}
