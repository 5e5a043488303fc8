// Package hellotest builds ClientHello streams for tests of the parser and of the
// proxy's hello gate.
package hellotest

import (
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/compass-egress/compass-egress/proxy/tlshello"
)

// Host is the host_name entry type of a server_name list, as SNIExt takes it.
const Host = string(rune(tlshello.ServerNameHost))

// ClientHello is the first flight crypto/tls's client sends for serverName ("": no
// server_name extension), as one handshake record.
func ClientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	}()
	head := make([]byte, tlshello.RecordHeaderLen)
	if _, err := io.ReadFull(s, head); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, int(head[3])<<8|int(head[4]))
	if _, err := io.ReadFull(s, rec); err != nil {
		t.Fatal(err)
	}
	s.Close()
	c.Close()
	<-done
	return append(head, rec...)
}

// Refragment cuts the handshake records of stream into records of at most size bytes.
func Refragment(stream []byte, size int) []byte {
	var msg []byte
	for len(stream) >= tlshello.RecordHeaderLen {
		n := int(stream[3])<<8 | int(stream[4])
		msg = append(msg, stream[tlshello.RecordHeaderLen:tlshello.RecordHeaderLen+n]...)
		stream = stream[tlshello.RecordHeaderLen+n:]
	}
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, tlshello.RecordHandshake, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// With is a minimal ClientHello record whose extensions block is exts.
func With(exts []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)                 // random
	body = append(body, 0)                                   // session id
	body = append(body, 0, 2, 0x13, 0x01)                    // one cipher suite
	body = append(body, 1, 0)                                // null compression
	body = append(body, byte(len(exts)>>8), byte(len(exts))) // extensions
	body = append(body, exts...)
	msg := append([]byte{tlshello.HandshakeClientHello, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{tlshello.RecordHandshake, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

// SNIExt is a server_name extension listing names as (type, name) pairs.
func SNIExt(entries ...string) []byte {
	var list []byte
	for i := 0; i+1 < len(entries); i += 2 {
		list = append(list, entries[i][0], byte(len(entries[i+1])>>8), byte(len(entries[i+1])))
		list = append(list, entries[i+1]...)
	}
	data := append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
	return append([]byte{0, tlshello.ExtServerName, byte(len(data) >> 8), byte(len(data))}, data...)
}
