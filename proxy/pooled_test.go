package proxy

import (
	"net"
	"testing"
	"time"
)

// TestPooledConnRecheckedAfterSwap: an HTTP request decided under one rule set that gets
// a pooled upstream connection after a swap has that connection's real address checked
// under the new set; a disallowed one is closed before the request is written.
func TestPooledConnRecheckedAfterSwap(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["dual.test"]}`)
	decided := h.srv.Current()
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`)
	cases := []struct {
		upstream *upstream
		closed   bool
	}{{h.a, true}, {h.b, false}}
	for _, tc := range cases {
		ip := tc.upstream.ip
		c, err := net.Dial("tcp", tc.upstream.echoHostPort(ip.String()))
		if err != nil {
			t.Fatal(err)
		}
		entry := &liveConn{typ: typeHTTP, name: "dual.test", addr: h.b.ip, port: tc.upstream.echoPort}
		h.srv.gotUpstreamConn(decided, entry, c)
		if entry.addr != ip {
			t.Errorf("%s: tracked address %s", ip, entry.addr)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write([]byte("x"))
		if closed := err != nil; closed != tc.closed {
			t.Errorf("%s: closed %v (%v), want %v", ip, closed, err, tc.closed)
		}
		c.Close()
	}
}
