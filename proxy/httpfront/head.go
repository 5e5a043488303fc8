package httpfront

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

var (
	errHeadTooLong   = errors.New("proxy: request head too long")
	errTooManyFields = fmt.Errorf("%w: more than %d field lines", errHeadTooLong, MaxHeadFields)
)

// frontReaders are the connections' 4 KiB readers; a head that does not fit gets a
// reader of its own (see headFields).
var frontReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// rawFields are the fields of the head about to be read that net/http's parser drops:
// Host for absolute-form requests, Content-Length beside Transfer-Encoding.
type rawFields struct {
	hosts         []string
	contentLength bool
}

// headFields returns the rawFields of the head about to be read. It peeks without
// consuming; a head longer than the connection's reader moves the connection to a
// reader that fits the longest head allowed.
func (cc *clientConn) headFields() (rawFields, error) {
	for {
		buf, _ := cc.br.Peek(cc.br.Buffered())
		if end := headEnd(buf); end >= 0 {
			// Every line but the request line and the empty one; a folded line counts too.
			if bytes.Count(buf[:end], []byte("\n"))-2 > MaxHeadFields {
				return rawFields{}, errTooManyFields
			}
			return rawFields{
				hosts:         scanField(buf[:end], "host"),
				contentLength: scanField(buf[:end], "content-length") != nil,
			}, nil
		}
		if len(buf) == cc.br.Size() {
			if cc.br.Size() >= MaxHeadBytes {
				return rawFields{}, errHeadTooLong
			}
			rest := append([]byte(nil), buf...)
			old := cc.br
			cc.br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(rest), cc.in), MaxHeadBytes)
			old.Reset(nil)
			frontReaders.Put(old)
			continue
		}
		if _, err := cc.br.Peek(len(buf) + 1); err != nil {
			// The parser meets the same end and reports it.
			return rawFields{}, nil
		}
	}
}

// headEnd is the length of the head at the start of buf (through its empty line), or -1.
func headEnd(buf []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			return -1
		}
		line := buf[i : i+j]
		i += j + 1
		if len(line) == 0 || len(line) == 1 && line[0] == '\r' {
			return i
		}
	}
}

// scanField returns the values of the fields of a head named name (in lower case),
// read as net/textproto reads them: a line that starts with a space or a tab continues
// the field before it (obsolete line folding), each line trimmed and joined with one
// space.
func scanField(head []byte, name string) []string {
	var values []string
	_, rest, _ := bytes.Cut(head, []byte("\n")) // the request line
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if len(line) <= len(name) || line[len(name)] != ':' || !bytes.EqualFold(line[:len(name)], []byte(name)) {
			continue
		}
		value := string(trimLine(line)[len(name)+1:])
		for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
			line, rest, _ = bytes.Cut(rest, []byte("\n"))
			value += " " + string(trimLine(line))
		}
		values = append(values, strings.TrimLeft(value, " \t"))
	}
	return values
}

// trimLine is a head's line as net/textproto trims it: without its CR, then without
// the spaces and tabs at either end.
func trimLine(line []byte) []byte {
	return bytes.Trim(bytes.TrimSuffix(line, []byte("\r")), " \t")
}
