package connio

import (
	"net"
	"testing"
)

// TestCapListenerHoldsSlotUntilClose: a DNS-over-TCP connection holds its slot until
// it is closed, however many times Close is called.
func TestCapListenerHoldsSlotUntilClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := NewCapListener(ln, 1)
	defer cl.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := cl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sem := cl.(CapListener).sem
	if len(sem) != 1 {
		t.Fatalf("slots taken with one connection open: %d", len(sem))
	}
	c.Close()
	c.Close()
	if len(sem) != 0 {
		t.Fatalf("slots taken after close: %d", len(sem))
	}
}
