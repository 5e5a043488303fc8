package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
)

// clientHello is the first flight crypto/tls's client sends for serverName ("": no
// server_name extension), as one handshake record.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	}()
	head := make([]byte, tlsRecordHeaderLen)
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

// refragment cuts the handshake records of stream into records of at most size bytes.
func refragment(stream []byte, size int) []byte {
	var msg []byte
	for len(stream) >= tlsRecordHeaderLen {
		n := int(stream[3])<<8 | int(stream[4])
		msg = append(msg, stream[tlsRecordHeaderLen:tlsRecordHeaderLen+n]...)
		stream = stream[tlsRecordHeaderLen+n:]
	}
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, tlsRecordHandshake, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// helloWith is a minimal ClientHello record whose extensions block is exts.
func helloWith(exts []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)                 // random
	body = append(body, 0)                                   // session id
	body = append(body, 0, 2, 0x13, 0x01)                    // one cipher suite
	body = append(body, 1, 0)                                // null compression
	body = append(body, byte(len(exts)>>8), byte(len(exts))) // extensions
	body = append(body, exts...)
	msg := append([]byte{tlsClientHello, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{tlsRecordHandshake, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

// sniExt is a server_name extension listing names as (type, name) pairs.
func sniExt(entries ...string) []byte {
	var list []byte
	for i := 0; i+1 < len(entries); i += 2 {
		list = append(list, entries[i][0], byte(len(entries[i+1])>>8), byte(len(entries[i+1])))
		list = append(list, entries[i+1]...)
	}
	data := append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
	return append([]byte{0, tlsExtServerName, byte(len(data) >> 8), byte(len(data))}, data...)
}

func TestHelloServerName(t *testing.T) {
	hello := clientHello(t, "a.test")
	host := string([]byte{tlsServerNameHost})
	noExts := helloWith(nil)
	noExts = append(noExts[:len(noExts)-2], noExts[len(noExts):]...) // no extensions block at all
	noExts[4] -= 2
	noExts[8] -= 2
	trailing := append(helloWith(nil), 0) // one byte inside the hello, after its extensions
	trailing[4]++
	trailing[8]++
	for _, tc := range []struct {
		name   string
		stream []byte
		want   string
		err    bool
	}{
		{"crypto/tls hello", hello, "a.test", false},
		{"bytes after the hello are not read", append(append([]byte{}, hello...), 23, 3, 3, 0, 1, 'x'), "a.test", false},
		{"no server name", clientHello(t, ""), "", false},
		{"one-byte records", refragment(hello, 1), "a.test", false},
		{"seven-byte records", refragment(hello, 7), "a.test", false},
		{"no extensions (TLS 1.2)", noExts, "", false},
		{"one host name", helloWith(sniExt(host, "b.test")), "b.test", false},
		{"another name type is skipped", helloWith(sniExt("\x01", "x", host, "b.test")), "b.test", false},
		{"two host names", helloWith(sniExt(host, "a.test", host, "b.test")), "", true},
		{"two server_name extensions", helloWith(append(sniExt(host, "a.test"), sniExt(host, "b.test")...)), "", true},
		{"empty host name", helloWith(sniExt(host, "")), "", true},
		{"empty name list", helloWith([]byte{0, 0, 0, 2, 0, 0}), "", true},
		{"extension longer than its block", helloWith([]byte{0, 5, 0, 9, 0}), "", true},
		{"bytes after the extensions block", trailing, "", true},
		{"not a handshake record", append([]byte{23}, hello[1:]...), "", true},
		{"not TLS's major version", append([]byte{22, 2}, hello[2:]...), "", true},
		{"empty record", []byte{22, 3, 1, 0, 0}, "", true},
		{"record over 16 KiB", []byte{22, 3, 1, 0x40, 0x01}, "", true},
		{"not a ClientHello", []byte{22, 3, 1, 0, 4, 2, 0, 0, 0}, "", true},
		{"hello over 16 KiB", []byte{22, 3, 1, 0, 4, 1, 0, 0x40, 0x01}, "", true},
		{"truncated body", []byte{22, 3, 1, 0, 6, 1, 0, 0, 2, 3, 3}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, more, err := readHello(tc.stream)
			if more || name != tc.want || (err != nil) != tc.err || (err != nil && !errors.Is(err, errMalformedHello)) {
				t.Fatalf("got %q more=%v err=%v, want %q err=%v", name, more, err, tc.want, tc.err)
			}
		})
	}
}

// Every proper prefix of a hello, whatever its records, asks for more, and never reads
// as a verdict of its own.
func TestHelloServerNamePrefixes(t *testing.T) {
	for _, size := range []int{1, 100, tlsMaxRecordLen} {
		stream := refragment(clientHello(t, "a.test"), size)
		for n := range len(stream) {
			if name, more, err := readHello(stream[:n]); !more || name != "" || err != nil {
				t.Fatalf("records of %d, prefix %d of %d: %q more=%v err=%v", size, n, len(stream), name, more, err)
			}
		}
	}
}

func FuzzHelloServerName(f *testing.F) {
	hello := clientHello(f, "a.test")
	f.Add(hello)
	f.Add(refragment(hello, 3))
	f.Add(helloWith(sniExt("\x00", "b.test")))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, stream []byte) {
		name, more, err := readHello(stream)
		if err != nil && (more || name != "") {
			t.Fatalf("an error with more=%v name=%q", more, name)
		}
		if err == nil && !more {
			// A hello that has ended is decided by its own bytes alone.
			n2, m2, e2 := readHello(append(bytes.Clone(stream), 0xff, 0xff))
			if n2 != name || m2 || e2 != nil {
				t.Fatalf("bytes after a complete hello changed %q into %q more=%v err=%v", name, n2, m2, e2)
			}
		}
	})
}

// The parser tells a hello that carries an encrypted_client_hello extension (ECH, or a
// browser's GREASE of it) from one that does not.
func TestHelloParserSeesEncryptedHello(t *testing.T) {
	host := string([]byte{tlsServerNameHost})
	for _, tc := range []struct {
		name   string
		stream []byte
		ech    bool
	}{
		{"crypto/tls without ECH", clientHello(t, "a.test"), false},
		{"an encrypted_client_hello extension", helloWith(append(sniExt(host, "a.test"), 0xfe, 0x0d, 0, 0)), true},
		{"the extension alone", helloWith([]byte{0xfe, 0x0d, 0, 0}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p helloParser
			if _, more, err := p.read(tc.stream); more || err != nil || p.ech != tc.ech {
				t.Fatalf("more=%v err=%v ech=%v, want ech=%v", more, err, p.ech, tc.ech)
			}
		})
	}
}

// readHello is what a gate's parser makes of stream read at once.
func readHello(stream []byte) (name string, more bool, err error) {
	var p helloParser
	return p.read(stream)
}
