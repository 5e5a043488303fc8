package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
)

// BenchmarkTransparentAndConnect measures the transparent path beside the explicit
// one, in the same run: tunnel set-ups (connect, decide, dial, one byte each way,
// close) and bulk throughput through one tunnel, to the same loopback echo upstream,
// allowed by the same address rule. The original destination is a constant here (the
// kernel's lookup is one getsockopt).
func BenchmarkTransparentAndConnect(b *testing.B) {
	var dst atomic.Pointer[netip.AddrPort]
	th := newTransparentHarness(b, func(c *Config) {
		c.Logger = discardLogger()
		c.origDst = func(*net.TCPConn) (netip.AddrPort, error) { return *dst.Load(), nil }
	})
	target := ap(addrA, th.a.echoPort)
	dst.Store(&target)
	th.apply(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/32"]}`)
	open := map[string]func(b *testing.B) (net.Conn, io.Reader){
		"connect": func(b *testing.B) (net.Conn, io.Reader) {
			c, err := net.Dial("tcp", th.srv.ProxyAddr().String())
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
			if err != nil || resp.StatusCode != 200 {
				b.Fatalf("CONNECT: %v %v", resp, err)
			}
			if br.Buffered() == 0 { // read the socket itself, as the transparent client does
				return c, c
			}
			return c, br
		},
		"transparent": func(b *testing.B) (net.Conn, io.Reader) {
			c, err := net.Dial("tcp", th.srv.TransparentAddr().String())
			if err != nil {
				b.Fatal(err)
			}
			return c, c
		},
	}
	for _, path := range []string{"connect", "transparent"} {
		b.Run("setup/"+path, func(b *testing.B) {
			one := make([]byte, 1)
			for range b.N {
				c, r := open[path](b)
				if _, err := c.Write([]byte("x")); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(r, one); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
	for _, path := range []string{"connect", "transparent"} {
		b.Run("bulk/"+path, func(b *testing.B) {
			const chunk = 1 << 20
			c, r := open[path](b)
			defer c.Close()
			b.SetBytes(chunk)
			done := make(chan error, 1)
			go func() {
				_, err := io.CopyN(io.Discard, r, int64(b.N)*chunk)
				done <- err
			}()
			buf := make([]byte, chunk)
			buf[0] = 'x' // not a TLS record, not a method: read as TCP
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
