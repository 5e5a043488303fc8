// Package origdst reads the destination a TCP connection had before the
// kernel's NAT redirected it to this socket (getsockopt SO_ORIGINAL_DST).
//
// The answer comes from the connection's conntrack entry, so it needs no
// privilege: the sidecar (an unprivileged user without NET_ADMIN) can call it
// on every connection its transparent listener accepts. It depends on the
// standard library and golang.org/x/sys only, so the sidecar binary stays free
// of netlink code.
package origdst

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Option numbers from linux/netfilter_ipv4.h and linux/netfilter_ipv6/ip6_tables.h.
const (
	soOriginalDst     = 80 // SO_ORIGINAL_DST at SOL_IP
	ip6tSoOriginalDst = 80 // IP6T_SO_ORIGINAL_DST at SOL_IPV6
)

// ErrNotRedirected means the kernel has no NAT record for the connection: it
// reached the socket directly, or conntrack has already forgotten it.
var ErrNotRedirected = errors.New("origdst: connection has no original destination (not redirected, or no conntrack entry)")

// Lookup returns the original destination of c, an accepted TCP connection.
// A connection whose local address is IPv4 (or IPv4-mapped on a dual-stack
// socket) is looked up in the IPv4 conntrack table, any other in the IPv6 one.
func Lookup(c *net.TCPConn) (netip.AddrPort, error) {
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("origdst: local address %v is not TCP", c.LocalAddr())
	}
	v4 := local.IP.To4() != nil
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: raw connection: %w", err)
	}
	var (
		buf  [unix.SizeofSockaddrInet6]byte
		n    int
		serr error
	)
	err = rc.Control(func(fd uintptr) {
		n, serr = getsockopt(int(fd), v4, buf[:])
	})
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: raw connection: %w", err)
	}
	if errors.Is(serr, unix.ENOENT) {
		return netip.AddrPort{}, fmt.Errorf("%w: local %s, remote %s", ErrNotRedirected, c.LocalAddr(), c.RemoteAddr())
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: getsockopt %s on local %s: %w", optName(v4), c.LocalAddr(), serr)
	}
	return ParseSockaddr(buf[:n])
}

func optName(v4 bool) string {
	if v4 {
		return "SOL_IP/SO_ORIGINAL_DST"
	}
	return "SOL_IPV6/IP6T_SO_ORIGINAL_DST"
}

// getsockopt fills b with the original destination's sockaddr and returns its
// length. x/sys/unix has no getsockopt that returns a raw sockaddr, hence the
// direct system call.
func getsockopt(fd int, v4 bool, b []byte) (int, error) {
	level, opt := unix.SOL_IPV6, ip6tSoOriginalDst
	if v4 {
		level, opt = unix.SOL_IP, soOriginalDst
	}
	l := uint32(len(b))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return 0, syscall.Errno(errno)
	}
	return int(l), nil
}
