package connio

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The accepted socket, not the listener, is what must carry keep-alive: this checks
// that the kernel copied the listener's options and that net set none of its own.
func TestAcceptedClientInheritsKeepAlive(t *testing.T) {
	ln, err := ListenProxy("127.0.0.1:0")
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
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, KeepAliveIdle},
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

// TestAdminSocketBoundWithItsMode: the socket has its mode from the bind, whatever the
// process's umask, and the umask is the process's again afterwards.
func TestAdminSocketBoundWithItsMode(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := ListenAdmin(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != adminSocketMode {
		t.Errorf("socket mode %v, want %v", fi.Mode().Perm(), os.FileMode(adminSocketMode))
	}
	if now := unix.Umask(0); now != 0 {
		t.Errorf("umask %#o after the bind, want it restored to 0", now)
	}
}
