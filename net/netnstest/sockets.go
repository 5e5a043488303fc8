package netnstest

import (
	"net"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/net/nsthread"
)

// ListenTCP opens a TCP listener on addr inside ns, closed when t ends.
func ListenTCP(t testing.TB, ns NS, addr string) *net.TCPListener {
	t.Helper()
	var ln net.Listener
	err := nsthread.Run(ns.Handle, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("netnstest: listen tcp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.(*net.TCPListener)
}

// ListenUDP opens a UDP socket on addr inside ns, closed when t ends.
func ListenUDP(t testing.TB, ns NS, addr string) *net.UDPConn {
	t.Helper()
	var pc net.PacketConn
	err := nsthread.Run(ns.Handle, func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("netnstest: listen udp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.(*net.UDPConn)
}

// Dial connects from inside ns. Only the socket is made in ns; the returned
// connection can be used from any goroutine.
func Dial(ns NS, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := nsthread.Run(ns.Handle, func() (err error) {
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}
