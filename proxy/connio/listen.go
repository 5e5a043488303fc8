package connio

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Keep-alive of accepted clients: a sandbox that vanished (the controller disconnected
// it between phases) is found within KeepAliveIdle + keepAliveCount × keepAliveInterval
// (2.5 minutes) instead of holding its tunnels until the idle timeout. The values are
// net.ListenConfig's defaults.
const (
	KeepAliveIdle     = 15 // seconds
	keepAliveInterval = 15 // seconds
	keepAliveCount    = 9
)

// UpstreamKeepAlive is the same keep-alive for upstream connections: HTTP ones from
// their dial, tunnels once they have lived a while (IdleWatch.Start).
var UpstreamKeepAlive = net.KeepAliveConfig{Enable: true, Idle: KeepAliveIdle * time.Second,
	Interval: keepAliveInterval * time.Second, Count: keepAliveCount}

// ListenProxy binds the proxy listener. Linux copies a listening socket's options to
// every socket it accepts, so keep-alive is set once here rather than with four
// setsockopt calls per connection as net.ListenConfig would.
func ListenProxy(addr string) (net.Listener, error) {
	return ListenTCP(addr, net.ListenConfig{KeepAlive: -1, Control: controlProxyListener})
}

// ListenTCP binds every TCP listener of the sidecar (proxy, DNS, metrics) as a plain
// TCP socket. Since Go 1.24 net listens with Multipath TCP where the kernel has it,
// which would let a client of the sandbox open further subflows to the sidecar and
// put every accepted connection behind the kernel's MPTCP layer (in fallback for plain
// clients): surface the sidecar has no use for, facing the untrusted side.
func ListenTCP(addr string, lc net.ListenConfig) (net.Listener, error) {
	lc.SetMultipathTCP(false)
	return lc.Listen(context.Background(), "tcp", addr)
}

func controlProxyListener(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		for _, o := range []struct {
			level, name, value int
			what               string
		}{
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, KeepAliveIdle, "TCP_KEEPIDLE"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveInterval, "TCP_KEEPINTVL"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount, "TCP_KEEPCNT"},
		} {
			if err := unix.SetsockoptInt(int(fd), o.level, o.name, o.value); err != nil {
				serr = fmt.Errorf("set %s: %w", o.what, err)
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// adminSocketMode is the admin socket's mode: the controller's user and group only.
const adminSocketMode = 0o660

// ListenAdmin binds the admin API's unix socket with adminSocketMode from the start.
// A chmod after the bind would leave a window in which anyone who can reach the path
// could connect, and a connection queued then is served later. The umask is the
// process's, so it is restored at once; nothing else creates files while the proxy
// starts.
func ListenAdmin(path string) (net.Listener, error) {
	old := unix.Umask(0o777 &^ adminSocketMode)
	defer unix.Umask(old)
	return net.Listen("unix", path)
}
