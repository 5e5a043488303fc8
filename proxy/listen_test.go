package proxy

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/proxy/connio"
)

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
		if c, ok := d.Listener.(connio.CapListener); ok {
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
