package proxybench

import (
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The load generator shares the two CPUs with the proxy it measures, so its sockets
// carry nothing a connection that lives for milliseconds does not need: no keep-alive
// on either end, and a plain TCP listener rather than Go's default Multipath TCP one.
func TestLoadGeneratorSocketsAreLean(t *testing.T) {
	u, err := StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()

	c, err := dialer.Dial("tcp", u.StreamAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := sockopt(t, c.(syscall.Conn), unix.SOL_SOCKET, unix.SO_KEEPALIVE); got != 0 {
		t.Errorf("dialled connection: SO_KEEPALIVE %d, want 0", got)
	}

	var accepted net.Conn
	for deadline := time.Now().Add(5 * time.Second); accepted == nil && time.Now().Before(deadline); {
		u.mu.Lock()
		for ac := range u.conns {
			accepted = ac
		}
		u.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	if accepted == nil {
		t.Fatal("the upstream accepted no connection")
	}
	if got := sockopt(t, accepted.(syscall.Conn), unix.SOL_SOCKET, unix.SO_KEEPALIVE); got != 0 {
		t.Errorf("accepted connection: SO_KEEPALIVE %d, want 0", got)
	}
	for name, ln := range map[string]net.Listener{"stream": u.stream, "http": u.http} {
		if got := sockopt(t, ln.(syscall.Conn), unix.SOL_SOCKET, unix.SO_PROTOCOL); got != unix.IPPROTO_TCP {
			t.Errorf("%s listener: protocol %d, want plain TCP (%d)", name, got, unix.IPPROTO_TCP)
		}
	}
}

func sockopt(t *testing.T, c syscall.Conn, level, name int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), level, name) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}
