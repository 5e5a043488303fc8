package origdst_test

import (
	"errors"
	"net"
	"testing"

	"github.com/compass-egress/compass-egress/net/origdst"
)

// TestLookupNotRedirected: a loopback connection that no NAT rule touched has
// no original destination (or, where conntrack tracks it, its own address).
// The redirected case is covered end to end in package netnstest.
func TestLookupNotRedirected(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "tcp6" {
				addr = "[::1]:0"
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Skipf("no %s loopback here: %v", network, err)
			}
			defer ln.Close()
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, err := origdst.Lookup(s.(*net.TCPConn))
			switch {
			case errors.Is(err, origdst.ErrNotRedirected):
			case err == nil && got.String() == ln.Addr().String():
			default:
				t.Fatalf("Lookup() = %v, %v; want ErrNotRedirected or the listener's own address %s", got, err, ln.Addr())
			}
		})
	}
}
