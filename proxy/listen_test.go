package proxy

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// Every TCP socket the sidecar listens on faces the sandbox, and none may speak Multipath
// TCP (Go's default for listeners since 1.24): the kernel names the protocol of each.
func TestListenersArePlainTCP(t *testing.T) {
	if ctl, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		rc, err := ctl.(*net.TCPListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		if sockoptInt(t, rc, unix.SOL_SOCKET, unix.SO_PROTOCOL) != unix.IPPROTO_MPTCP {
			t.Log("this kernel gives Go's default listener no MPTCP, so plain TCP is all it could find here")
		}
		ctl.Close()
	}
	h := newHarness(t)
	listeners := map[string]net.Listener{"proxy": h.srv.proxyLn.Listener, "metrics": h.srv.metricsLn}
	for _, d := range h.srv.dnsServers {
		if c, ok := d.Listener.(capListener); ok {
			listeners["dns"] = c.Listener
		}
	}
	if len(listeners) != 3 {
		t.Fatalf("found the listeners %v, want proxy, metrics and dns", listeners)
	}
	for name, ln := range listeners {
		tl, ok := ln.(*net.TCPListener)
		if !ok {
			t.Fatalf("%s listener is a %T, not a *net.TCPListener", name, ln)
		}
		rc, err := tl.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		if proto := sockoptInt(t, rc, unix.SOL_SOCKET, unix.SO_PROTOCOL); proto != unix.IPPROTO_TCP {
			t.Errorf("%s listener: SO_PROTOCOL = %d, want IPPROTO_TCP (%d); IPPROTO_MPTCP is %d", name, proto, unix.IPPROTO_TCP, unix.IPPROTO_MPTCP)
		}
	}
}

// sockoptInt reads an integer socket option through rc.
func sockoptInt(t *testing.T, rc syscall.RawConn, level, opt int) int {
	t.Helper()
	var (
		v    int
		verr error
	)
	if err := rc.Control(func(fd uintptr) { v, verr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if verr != nil {
		t.Fatal(verr)
	}
	return v
}

// TestAdminSocketBoundWithItsMode: the socket has its mode from the bind, whatever the
// process's umask, and the umask is the process's again afterwards.
func TestAdminSocketBoundWithItsMode(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := listenAdmin(path)
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

// Start creates a missing directory of the admin socket for its owner and group only:
// whoever can list it sees the socket, and the socket is the whole admin API.
func TestAdminSocketDirMode(t *testing.T) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	var umask os.FileMode
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Umask:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			umask = os.FileMode(n)
		}
	}
	h := newHarness(t)
	fi, err := os.Stat(filepath.Dir(h.socket))
	if err != nil {
		t.Fatal(err)
	}
	if want := os.FileMode(0o750) &^ umask; fi.Mode().Perm() != want {
		t.Errorf("admin socket directory mode %v, want %v", fi.Mode().Perm(), want)
	}
}
