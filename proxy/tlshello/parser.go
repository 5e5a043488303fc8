// Package tlshello reads the server name a TLS ClientHello carries, from the first
// bytes of a stream as they arrive.
//
// A tunnel is decided by its CONNECT target, but a front end that serves many names
// behind one address (a CDN) routes a TLS connection by the server name its ClientHello
// carries (SNI, RFC 6066), so an allowed target would carry a handshake with any name
// the same front end serves. The proxy's relay therefore reads the name before it
// forwards the client's first bytes (its hello gate).
package tlshello

import (
	"errors"
)

// The TLS wire vocabulary the parser reads (and tests write).
const (
	recordFirstType      = 20 // change_cipher_spec: the lowest record type (RFC 8446 §5.1)
	recordLastType       = 24 // heartbeat (RFC 6520)
	RecordHandshake      = 22
	RecordHeaderLen      = 5
	MaxRecordLen         = 1 << 14 // RFC 8446 §5.1: a plaintext record's fragment
	HandshakeClientHello = 1
	ExtServerName        = 0
	extEncryptedHello    = 0xfe0d // encrypted_client_hello (draft-ietf-tls-esni)
	ServerNameHost       = 0
	alertUnrecognized    = 112 // unrecognized_name (RFC 6066 §3)
)

// StartsRecord reports whether b, the first byte of a stream, is a TLS record type. Any
// record type counts, not only a handshake: servers read records of other types before
// a ClientHello (Go's crypto/tls and BoringSSL skip a warning alert), and then the hello
// after them; Parser refuses such a stream.
func StartsRecord(b byte) bool { return b >= recordFirstType && b <= recordLastType }

// UnrecognizedNameAlert is the fatal alert record a refused hello gets: its client
// reports the server name as unrecognised rather than a bare reset.
var UnrecognizedNameAlert = []byte{21, 3, 3, 0, 2, 2, alertUnrecognized}

// maxHelloMessage bounds a ClientHello (handshake body). Today's clients send 0.5–2 KiB
// (post-quantum key shares included); a larger one is refused rather than held.
const maxHelloMessage = 16 << 10

// MaxStream bounds the bytes held while a ClientHello arrives. Splitting a hello
// into many small records is a known way past filters that read only the first record;
// it is reassembled here, up to this many bytes of records.
const MaxStream = 64 << 10

// ErrMalformed is a stream that is not one readable ClientHello.
var ErrMalformed = errors.New("malformed TLS ClientHello")

// Parser reads the ClientHello that a tunnel's first bytes (a gate's held bytes,
// which grow between calls) begin with. It reads each record once: re-reading them all
// at each call made a hello of many small records, arriving in as many reads, cost the
// square of its length.
type Parser struct {
	off int    // the records before off are in msg
	msg []byte // the handshake bytes of those records
	ech bool   // the hello read carries an encrypted_client_hello extension
}

// ECH reports whether the hello read carries an encrypted_client_hello extension (ECH,
// or a browser's GREASE of it).
func (p *Parser) ECH() bool { return p.ech }

// Read returns the server name ("" if it names none) of the ClientHello that stream
// begins with; stream begins with the stream of p's earlier calls. more reports a
// prefix of a ClientHello that has not ended yet. A stream that is not one readable
// ClientHello (another record type or message first, two host names, lengths that do
// not add up) is ErrMalformed: a server would read it otherwise than this parser,
// or not at all.
func (p *Parser) Read(stream []byte) (name string, more bool, err error) {
	for {
		msg, off := p.msg, p.off
		if len(msg) >= 4 {
			if msg[0] != HandshakeClientHello {
				return "", false, ErrMalformed
			}
			n := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if n > maxHelloMessage {
				return "", false, ErrMalformed
			}
			if len(msg) >= 4+n {
				name, p.ech, err = parseClientHello(msg[4 : 4+n])
				return name, false, err
			}
		}
		if len(stream)-off < RecordHeaderLen {
			return "", true, nil
		}
		h := stream[off : off+RecordHeaderLen]
		length := int(h[3])<<8 | int(h[4])
		if h[0] != RecordHandshake || h[1] != 3 || length == 0 || length > MaxRecordLen {
			return "", false, ErrMalformed
		}
		if len(stream)-off-RecordHeaderLen < length {
			return "", true, nil
		}
		off += RecordHeaderLen
		p.msg = append(msg, stream[off:off+length]...)
		p.off = off + length
	}
}

// parseClientHello returns the host name of a ClientHello body (RFC 8446 §4.1.2, RFC
// 5246 §7.4.1.2), and whether it carries an encrypted_client_hello extension.
func parseClientHello(body []byte) (name string, ech bool, err error) {
	r := helloReader(body)
	if !r.skip(2+32) || !r.skipVec(1) || !r.skipVec(2) || !r.skipVec(1) {
		return "", false, ErrMalformed
	}
	if r.empty() { // TLS 1.2 allows a hello without extensions
		return "", false, nil
	}
	exts, ok := r.vec(2)
	if !ok || !r.empty() {
		return "", false, ErrMalformed
	}
	seen := false
	for !exts.empty() {
		typ, ok := exts.u16()
		if !ok {
			return "", false, ErrMalformed
		}
		data, ok := exts.vec(2)
		if !ok {
			return "", false, ErrMalformed
		}
		if typ == extEncryptedHello {
			ech = true
		}
		if typ != ExtServerName {
			continue
		}
		if seen { // a second server_name extension: servers disagree on which counts
			return "", false, ErrMalformed
		}
		seen = true
		if name, err = serverNameExt(data); err != nil {
			return "", false, err
		}
	}
	return name, ech, nil
}

// serverNameExt reads the one host name of a server_name extension's list.
func serverNameExt(data helloReader) (string, error) {
	list, ok := data.vec(2)
	if !ok || !data.empty() || list.empty() {
		return "", ErrMalformed
	}
	name := ""
	for !list.empty() {
		typ, ok := list.u8()
		if !ok {
			return "", ErrMalformed
		}
		v, ok := list.vec(2)
		if !ok {
			return "", ErrMalformed
		}
		if typ != ServerNameHost {
			continue
		}
		if name != "" || v.empty() { // RFC 6066 §3: at most one host_name, never empty
			return "", ErrMalformed
		}
		name = string(v)
	}
	return name, nil
}

// helloReader reads big-endian integers and length-prefixed vectors, failing (false)
// rather than reading past its end.
type helloReader []byte

func (r *helloReader) empty() bool { return len(*r) == 0 }

func (r *helloReader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *helloReader) u8() (byte, bool) {
	if len(*r) < 1 {
		return 0, false
	}
	v := (*r)[0]
	*r = (*r)[1:]
	return v, true
}

func (r *helloReader) u16() (int, bool) {
	if len(*r) < 2 {
		return 0, false
	}
	v := int((*r)[0])<<8 | int((*r)[1])
	*r = (*r)[2:]
	return v, true
}

// vec reads a vector whose length takes lenBytes (1 or 2) bytes.
func (r *helloReader) vec(lenBytes int) (helloReader, bool) {
	var n int
	if lenBytes == 1 {
		b, ok := r.u8()
		if !ok {
			return nil, false
		}
		n = int(b)
	} else {
		var ok bool
		if n, ok = r.u16(); !ok {
			return nil, false
		}
	}
	if len(*r) < n {
		return nil, false
	}
	v := (*r)[:n]
	*r = (*r)[n:]
	return v, true
}

func (r *helloReader) skipVec(lenBytes int) bool {
	_, ok := r.vec(lenBytes)
	return ok
}
