package testutil

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// ServeDNS serves h on loopback UDP and TCP until the test ends, and returns the two
// addresses.
func ServeDNS(t testing.TB, h dns.Handler) (udp, tcp string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.ActivateAndServe()
		}()
		<-started
		t.Cleanup(func() {
			_ = srv.Shutdown()
			<-done
		})
	}
	return pc.LocalAddr().String(), ln.Addr().String()
}
