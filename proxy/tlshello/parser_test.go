package tlshello_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/compass-egress/compass-egress/proxy/tlshello"
	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
)

func TestHelloServerName(t *testing.T) {
	hello := hellotest.ClientHello(t, "a.test")
	host := hellotest.Host
	noExts := hellotest.With(nil)
	noExts = append(noExts[:len(noExts)-2], noExts[len(noExts):]...) // no extensions block at all
	noExts[4] -= 2
	noExts[8] -= 2
	trailing := append(hellotest.With(nil), 0) // one byte inside the hello, after its extensions
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
		{"no server name", hellotest.ClientHello(t, ""), "", false},
		{"one-byte records", hellotest.Refragment(hello, 1), "a.test", false},
		{"seven-byte records", hellotest.Refragment(hello, 7), "a.test", false},
		{"no extensions (TLS 1.2)", noExts, "", false},
		{"one host name", hellotest.With(hellotest.SNIExt(host, "b.test")), "b.test", false},
		{"another name type is skipped", hellotest.With(hellotest.SNIExt("\x01", "x", host, "b.test")), "b.test", false},
		{"two host names", hellotest.With(hellotest.SNIExt(host, "a.test", host, "b.test")), "", true},
		{"two server_name extensions", hellotest.With(append(hellotest.SNIExt(host, "a.test"), hellotest.SNIExt(host, "b.test")...)), "", true},
		{"empty host name", hellotest.With(hellotest.SNIExt(host, "")), "", true},
		{"empty name list", hellotest.With([]byte{0, 0, 0, 2, 0, 0}), "", true},
		{"extension longer than its block", hellotest.With([]byte{0, 5, 0, 9, 0}), "", true},
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
			if more || name != tc.want || (err != nil) != tc.err || (err != nil && !errors.Is(err, tlshello.ErrMalformed)) {
				t.Fatalf("got %q more=%v err=%v, want %q err=%v", name, more, err, tc.want, tc.err)
			}
		})
	}
}

// Every proper prefix of a hello, whatever its records, asks for more, and never reads
// as a verdict of its own.
func TestHelloServerNamePrefixes(t *testing.T) {
	for _, size := range []int{1, 100, tlshello.MaxRecordLen} {
		stream := hellotest.Refragment(hellotest.ClientHello(t, "a.test"), size)
		for n := range len(stream) {
			if name, more, err := readHello(stream[:n]); !more || name != "" || err != nil {
				t.Fatalf("records of %d, prefix %d of %d: %q more=%v err=%v", size, n, len(stream), name, more, err)
			}
		}
	}
}

func FuzzHelloServerName(f *testing.F) {
	hello := hellotest.ClientHello(f, "a.test")
	f.Add(hello)
	f.Add(hellotest.Refragment(hello, 3))
	f.Add(hellotest.With(hellotest.SNIExt("\x00", "b.test")))
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
	host := hellotest.Host
	for _, tc := range []struct {
		name   string
		stream []byte
		ech    bool
	}{
		{"crypto/tls without ECH", hellotest.ClientHello(t, "a.test"), false},
		{"an encrypted_client_hello extension", hellotest.With(append(hellotest.SNIExt(host, "a.test"), 0xfe, 0x0d, 0, 0)), true},
		{"the extension alone", hellotest.With([]byte{0xfe, 0x0d, 0, 0}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p tlshello.Parser
			if _, more, err := p.Read(tc.stream); more || err != nil || p.ECH() != tc.ech {
				t.Fatalf("more=%v err=%v ech=%v, want ech=%v", more, err, p.ECH(), tc.ech)
			}
		})
	}
}

// readHello is what a gate's parser makes of stream read at once.
func readHello(stream []byte) (name string, more bool, err error) {
	var p tlshello.Parser
	return p.Read(stream)
}

// Read as it grows, a stream gives what it gives read whole: each prefix asks for more,
// and the whole hello names its server, whatever the records and the reads' sizes.
func TestParserReadsAsItGrows(t *testing.T) {
	hello := hellotest.ClientHello(t, "b.test")
	for _, records := range []int{1, 5, 100, tlshello.MaxRecordLen} {
		stream := hellotest.Refragment(hello, records)
		for _, step := range []int{1, 3, 7, 64} {
			var p tlshello.Parser
			for end := step; ; end += step {
				end = min(end, len(stream))
				name, more, err := p.Read(stream[:end])
				if end < len(stream) {
					if !more || name != "" || err != nil {
						t.Fatalf("records of %d, reads of %d, at %d of %d: %q more=%v %v", records, step, end, len(stream), name, more, err)
					}
					continue
				}
				if name != "b.test" || more || err != nil {
					t.Fatalf("records of %d, reads of %d: %q more=%v %v", records, step, name, more, err)
				}
				break
			}
		}
	}
}
