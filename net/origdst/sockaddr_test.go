package origdst

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func sockaddr4(ip [4]byte, port uint16) []byte {
	b := make([]byte, unix.SizeofSockaddrInet4)
	binary.NativeEndian.PutUint16(b, unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], port)
	copy(b[4:], ip[:])
	return b
}

func sockaddr6(ip [16]byte, port uint16) []byte {
	b := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(b, unix.AF_INET6)
	binary.BigEndian.PutUint16(b[2:], port)
	copy(b[8:], ip[:])
	return b
}

func TestParseSockaddr(t *testing.T) {
	v6 := netip.MustParseAddr("2001:db8::7")
	tests := []struct {
		name    string
		in      []byte
		want    netip.AddrPort
		wantErr bool
	}{
		{"ipv4", sockaddr4([4]byte{203, 0, 113, 7}, 22), netip.MustParseAddrPort("203.0.113.7:22"), false},
		{"ipv4 high port", sockaddr4([4]byte{198, 51, 100, 9}, 65535), netip.MustParseAddrPort("198.51.100.9:65535"), false},
		{"ipv6", sockaddr6(v6.As16(), 443), netip.AddrPortFrom(v6, 443), false},
		{"empty", nil, netip.AddrPort{}, true},
		{"short ipv4", sockaddr4([4]byte{192, 0, 2, 1}, 1)[:7], netip.AddrPort{}, true},
		{"short ipv6", sockaddr6(v6.As16(), 1)[:23], netip.AddrPort{}, true},
		{"unknown family", []byte{0xff, 0xff, 0, 0, 0, 0, 0, 0}, netip.AddrPort{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSockaddr(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseSockaddr() = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// FuzzParseSockaddr checks that any accepted input gives a valid address whose
// family matches the input's and that the parser never panics.
func FuzzParseSockaddr(f *testing.F) {
	f.Add(sockaddr4([4]byte{203, 0, 113, 7}, 22))
	f.Add(sockaddr6(netip.MustParseAddr("2001:db8::1").As16(), 80))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ap, err := ParseSockaddr(b)
		if err != nil {
			return
		}
		if !ap.Addr().IsValid() {
			t.Fatalf("ParseSockaddr(%x) = invalid address without error", b)
		}
		want4 := binary.NativeEndian.Uint16(b) == unix.AF_INET
		if ap.Addr().Is4() != want4 {
			t.Fatalf("ParseSockaddr(%x) = %v: family does not match", b, ap)
		}
	})
}
