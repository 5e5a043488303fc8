package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/images/probe/probespec"
)

// The checks of a client that ignores the proxy variables: what it dials goes straight
// out, or, under the transparent path, to the sidecar, which decides and relays.

// dialTarget dials c.Target, first resolving its host through c.Resolver when set.
// name is the host as the check names it (for the TLS server name and the Host header).
func dialTarget(ctx context.Context, c Check) (conn net.Conn, name string, err error) {
	host, port, err := net.SplitHostPort(c.Target)
	if err != nil {
		return nil, "", err
	}
	addr := c.Target
	if c.Resolver != "" {
		ip, err := resolveA(ctx, c.Resolver, host)
		if err != nil {
			return nil, host, err
		}
		addr = net.JoinHostPort(ip, port)
	}
	var d net.Dialer
	conn, err = d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, host, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn, host, nil
}

// resolveA is the first A record resolver gives for name.
func resolveA(ctx context.Context, resolver, name string) (string, error) {
	resp, err := exchange(ctx, "udp", resolver, name)
	if err != nil {
		return "", fmt.Errorf("resolve %s through %s: %w", name, resolver, err)
	}
	if a := answerA(resp); len(a) > 0 {
		return a[0], nil
	}
	why := dns.RcodeToString[resp.Rcode]
	if ede, ok := refusalEDE(resp); ok {
		why += " from the sidecar (" + ede + ")"
	}
	return "", fmt.Errorf("resolve %s through %s: no address (%s)", name, resolver, why)
}

func directHTTP(ctx context.Context, c Check) Result {
	conn, host, err := dialTarget(ctx, c)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	defer conn.Close()
	if c.Host != "" {
		host = c.Host
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Target+"/", nil)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	req.Host = host
	req.Close = true
	if err := req.Write(conn); err != nil {
		return Result{Detail: "direct GET: " + err.Error()}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return Result{Detail: "direct GET: " + err.Error()}
	}
	resp.Body.Close()
	detail := "direct GET: " + resp.Status
	if v := resp.Header.Get(probespec.RefusalHeader); v != "" {
		return Result{Refused: strings.HasPrefix(v, probespec.RefusalDenied), Detail: detail + " from the sidecar (" + v + ")"}
	}
	return Result{Reachable: true, Detail: detail}
}

func directTLS(ctx context.Context, c Check) Result {
	conn, name, err := dialTarget(ctx, c)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	defer conn.Close()
	if c.Host != "" {
		name = c.Host
	}
	tc := tls.Client(conn, &tls.Config{ServerName: name, InsecureSkipVerify: true}) //nolint:gosec // the fake internet's certificate is self-signed; the check is about reachability
	if err := tc.HandshakeContext(ctx); err != nil {
		return Result{Detail: "TLS handshake, server name " + name + ": " + err.Error()}
	}
	detail := "TLS handshake done, server name " + name
	if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
		detail += ", certificate " + certs[0].Subject.String()
	}
	return Result{Reachable: true, Detail: detail}
}

func directTCP(ctx context.Context, c Check) Result {
	conn, _, err := dialTarget(ctx, c)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return Result{Reachable: true, Detail: "refused (the host answered)"}
		}
		return Result{Detail: err.Error()}
	}
	defer conn.Close()
	if c.Expect == "" {
		return Result{Reachable: true, Detail: "connected"}
	}
	first := make([]byte, 256)
	n, err := io.ReadAtLeast(conn, first, min(len(c.Expect), len(first)))
	got := fmt.Sprintf("%q", first[:n])
	switch {
	case n > 0 && bytes.HasPrefix(first[:n], []byte(c.Expect)):
		return Result{Reachable: true, Detail: "connected; the destination sent " + got}
	case n > 0:
		return Result{Detail: "connected; got " + got + ", want a start of " + fmt.Sprintf("%q", c.Expect)}
	}
	return Result{Detail: "connected, but nothing came back: " + err.Error()}
}

// refusalEDE is the text of the sidecar's Extended DNS Error in resp, if any.
func refusalEDE(resp *dns.Msg) (string, bool) {
	opt := resp.IsEdns0()
	if opt == nil {
		return "", false
	}
	for _, o := range opt.Option {
		if ede, ok := o.(*dns.EDNS0_EDE); ok && strings.HasPrefix(ede.ExtraText, probespec.RefusalEDEPrefix) {
			return ede.ExtraText, true
		}
	}
	return "", false
}
