package origdst

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ParseSockaddr decodes a struct sockaddr_in or sockaddr_in6 as the kernel
// writes it: the family in host byte order, the port in network byte order.
// An IPv6 scope is dropped: an original destination is never link-local here.
func ParseSockaddr(b []byte) (netip.AddrPort, error) {
	if len(b) < 2 {
		return netip.AddrPort{}, fmt.Errorf("origdst: sockaddr of %d bytes has no family", len(b))
	}
	switch fam := binary.NativeEndian.Uint16(b); fam {
	case unix.AF_INET:
		if len(b) < 8 {
			return netip.AddrPort{}, fmt.Errorf("origdst: sockaddr_in of %d bytes, want at least 8", len(b))
		}
		addr := netip.AddrFrom4([4]byte(b[4:8]))
		return netip.AddrPortFrom(addr, binary.BigEndian.Uint16(b[2:4])), nil
	case unix.AF_INET6:
		if len(b) < 24 {
			return netip.AddrPort{}, fmt.Errorf("origdst: sockaddr_in6 of %d bytes, want at least 24", len(b))
		}
		addr := netip.AddrFrom16([16]byte(b[8:24]))
		return netip.AddrPortFrom(addr, binary.BigEndian.Uint16(b[2:4])), nil
	default:
		return netip.AddrPort{}, fmt.Errorf("origdst: sockaddr family %d is neither AF_INET nor AF_INET6", fam)
	}
}
