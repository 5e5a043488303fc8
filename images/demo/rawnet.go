package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// resolve looks name up through the environment's resolver (in a restricted mode, the
// sidecar's DNS server).
func resolve(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}

// dnsQuery sends a DNS question for name straight to addr:53 over UDP, as a client with
// a hard-coded resolver does, and succeeds only on an answer that gives name an address.
func dnsQuery(addr, name string) error {
	c := &dns.Client{Net: "udp", Timeout: attemptTimeout}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := c.Exchange(m, net.JoinHostPort(addr, "53"))
	if err != nil {
		return err
	}
	if len(r.Answer) == 0 {
		return fmt.Errorf("no answer (rcode %s)", dns.RcodeToString[r.Rcode])
	}
	return nil
}

// udpEcho sends one datagram to addr (the fake internet's UDP echo port) and succeeds
// only if the same bytes come back.
func udpEcho(addr, payload string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(attemptTimeout))
	if _, err := io.WriteString(c, payload); err != nil {
		return err
	}
	buf := make([]byte, len(payload)+1)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("no echo: %w", err)
	}
	if string(buf[:n]) != payload {
		return fmt.Errorf("echo %q, sent %q", buf[:n], payload)
	}
	return nil
}

// sshExchange connects to hostPort with a raw socket, as an SSH client does: the server
// must speak first with an SSH banner, then echo the client's own banner back (what the
// fake internet's port 22 does). It returns the server's banner.
func sshExchange(hostPort string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", hostPort)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(attemptTimeout))
	r := bufio.NewReader(c)
	banner, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("no banner: %w", err)
	}
	banner = strings.TrimSpace(banner)
	if !strings.HasPrefix(banner, "SSH-2.0-") {
		return "", fmt.Errorf("not an SSH banner: %.60q", banner)
	}
	const hello = "SSH-2.0-compass-demo\r\n"
	if _, err := io.WriteString(c, hello); err != nil {
		return "", err
	}
	if echo, err := r.ReadString('\n'); err != nil || echo != hello {
		return "", fmt.Errorf("banner %s, then echo %q: %v", banner, echo, err)
	}
	return banner, nil
}
