package proxy

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// The accepted socket, not the listener, is what must carry keep-alive: this checks
// that the kernel copied the listener's options and that net set none of its own.
func TestAcceptedClientInheritsKeepAlive(t *testing.T) {
	ln, err := listenProxy("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rc, err := a.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		level, opt int
		want       int
	}{
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdle},
		{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveInterval},
		{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount},
	} {
		var (
			got  int
			gerr error
		)
		if err := rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), tc.level, tc.opt) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil || got != tc.want {
			t.Errorf("accepted socket %s = %d (%v), want %d", tc.name, got, gerr, tc.want)
		}
	}
}
