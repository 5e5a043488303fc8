// Command goclient is the e2e tests' Go client that ignores proxies, as Node's fetch and
// many CLIs do: it runs in an agent beside busybox (the harness's clients image) and
// sends traffic the transparent path must take, whatever HTTP_PROXY says.
//
//	goclient get URL [ADDR]   GET URL with Proxy: nil (TLS unverified: the fake internet's
//	                          certificate is self-signed); with ADDR, dial ADDR instead of
//	                          the URL's host (the server name and Host stay the URL's).
//	                          Prints the status and the body.
//	goclient udp ADDR         send one datagram to ADDR
//	goclient icmp ADDR        send one ICMP echo request to the IPv4 address ADDR on an
//	                          unprivileged ICMP socket (busybox ping needs NET_RAW, which
//	                          the agent lacks)
//
// A failure prints "error: ..." on stderr and exits 1.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

const timeout = 5 * time.Second

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "get":
		return get(args[1], "")
	case len(args) == 3 && args[0] == "get":
		return get(args[1], args[2])
	case len(args) == 2 && args[0] == "udp":
		return sendUDP(args[1])
	case len(args) == 2 && args[0] == "icmp":
		return sendICMP(args[1])
	}
	return fmt.Errorf("usage: goclient get URL [ADDR] | udp ADDR | icmp ADDR (got %q)", args)
}

func get(url, addr string) error {
	var d net.Dialer
	tr := &http.Transport{
		Proxy:           nil,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: func(ctx context.Context, network, hostport string) (net.Conn, error) {
			if addr != "" {
				hostport = addr
			}
			return d.DialContext(ctx, network, hostport)
		},
	}
	c := &http.Client{Transport: tr, Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("%s\n%s", resp.Status, body)
	return err
}

func sendUDP(addr string) error {
	c, err := net.DialTimeout("udp4", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("goclient"))
	return err
}

func sendICMP(addr string) error {
	dst, err := net.ResolveIPAddr("ip4", addr)
	if err != nil {
		return err
	}
	c, err := icmp.ListenPacket("udp4", "0.0.0.0")
	if err != nil {
		return err
	}
	defer c.Close()
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{Seq: 1, Data: []byte("goclient")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	_, err = c.WriteTo(b, &net.UDPAddr{IP: dst.IP})
	return err
}
