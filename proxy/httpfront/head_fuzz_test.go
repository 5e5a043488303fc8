package httpfront

import (
	"bufio"
	"bytes"
	"net/textproto"
	"slices"
	"testing"
)

// FuzzRawFields: the front's scan of a raw head finds exactly the Host and
// Content-Length values that net/textproto (net/http's header parser) reads from it,
// whenever that parser accepts the head; and it never panics.
func FuzzRawFields(f *testing.F) {
	for _, seed := range []string{
		"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET http://a.test/ HTTP/1.1\r\nhOsT:b.test:80 \r\nX: y\r\n\r\nbody",
		"GET http://a.test/ HTTP/1.1\nHost: a\nHost: b\n\n",
		"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n c.test\r\n\r\n",
		"GET http://a.test/ HTTP/1.1\r\nX-Host: a\r\nHost : b\r\n\r\n",
		"CONNECT a.test:443 HTTP/1.1\r\n\r\n",
		"POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\ncontent-length:\r\n 3\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		end := headEnd(raw)
		if end < 0 {
			return
		}
		line := bytes.IndexByte(raw, '\n')
		tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(raw[line+1 : end])))
		hdr, err := tp.ReadMIMEHeader()
		if err != nil {
			return
		}
		for _, name := range []string{"host", "content-length"} {
			got, want := scanField(raw[:end], name), hdr[textproto.CanonicalMIMEHeaderKey(name)]
			if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("head %q: scanned %s %q, textproto %q", raw[:end], name, got, want)
			}
		}
	})
}
