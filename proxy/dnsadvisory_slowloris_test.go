package proxy

// Advisory-driven DNS tests: DNS-over-TCP clients that hold their connection (slow
// loris). A server that waits on a client forever runs out of connection slots
// (maksimkurb/keen-pbr PR 51, "DNS probe TCP slowloris idle
// connection exhaustion"; CoreDNS's fixed TCP read timeouts,
// coredns/coredns issue 5780). With --dns-max-tcp-connections 1 a
// client that stalls must lose its slot, so the next client is answered.

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The first read of a connection ends after --dns-timeout, whole message included; a
// later one after the library's idle timeout (8 s). Either frees the slot.
func TestDNSAdvisoryStalledTCPClientLosesItsSlot(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DNSMaxTCPConns = 1 })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	// full is a whole query with its length prefix.
	full := func() []byte {
		m := new(dns.Msg)
		m.SetQuestion("a.test.", dns.TypeA)
		b, _ := m.Pack()
		return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
	}
	cases := []struct {
		name  string
		stall func(t *testing.T, c net.Conn, done <-chan struct{})
	}{
		// A length prefix and a few bytes of the message, then nothing.
		{"half a query", func(t *testing.T, c net.Conn, _ <-chan struct{}) {
			_, _ = c.Write(full()[:7])
		}},
		// One byte of a long message at a time, each well within any per-read timeout.
		{"a byte at a time", func(t *testing.T, c net.Conn, done <-chan struct{}) {
			_, _ = c.Write([]byte{0x0f, 0xff})
			go func() {
				tick := time.NewTicker(50 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-done:
						return
					case <-tick.C:
						if _, err := c.Write([]byte{'a'}); err != nil {
							return
						}
					}
				}
			}()
		}},
		// A whole query, its answer read, then the connection kept open and idle.
		{"idle after a query", func(t *testing.T, c net.Conn, _ <-chan struct{}) {
			if _, err := c.Write(full()); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			var n uint16
			if err := binary.Read(c, binary.BigEndian, &n); err != nil {
				t.Fatalf("no answer to the first query: %v", err)
			}
			if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", h.srv.DNSAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			done := make(chan struct{})
			defer close(done)
			tc.stall(t, c, done)
			// Waits in the accept queue until the stalled connection gives its slot
			// back.
			m := new(dns.Msg)
			m.SetQuestion("a.test.", dns.TypeA)
			resp, _, err := (&dns.Client{Net: "tcp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
			if err != nil {
				t.Fatalf("the next client got no answer: %v", err)
			}
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("the next client: %v", resp)
			}
			// The server closed the stalled connection: a read ends (EOF or reset),
			// not at our deadline.
			_ = c.SetReadDeadline(time.Now().Add(hangGuard))
			_, err = io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the stalled connection is still open after %v", hangGuard)
			}
		})
	}
}
