package testutil

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// WaitFor polls cond until it holds, failing the test once within has passed.
func WaitFor(t testing.TB, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %v", within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TCPPair returns the two ends of a loopback TCP connection, both closed when the
// test ends, with no TCP keep-alive (as the proxy dials a tunnel's upstream; Go's
// default would turn it on with the proxy's own settings).
func TCPPair(t testing.TB) (local, peer *net.TCPConn) {
	t.Helper()
	ln, err := (&net.ListenConfig{KeepAlive: -1}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, err := (&net.Dialer{KeepAlive: -1}).Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	l, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.(*net.TCPConn), p.(*net.TCPConn)
}

// SockoptInt reads an integer socket option through rc.
func SockoptInt(t testing.TB, rc syscall.RawConn, level, opt int) int {
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

// TCPSockopt reads an integer socket option of c.
func TCPSockopt(t testing.TB, c *net.TCPConn, level, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return SockoptInt(t, rc, level, opt)
}
