package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/images/probe/probespec"
)

// Check and Result are the probe's protocol, shared with its callers.
type (
	Check  = probespec.Check
	Result = probespec.Result
)

func runChecks(checks []Check) []Result {
	out := make([]Result, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout := 3 * time.Second
			if c.TimeoutMS > 0 {
				timeout = time.Duration(c.TimeoutMS) * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			r := runCheck(ctx, c)
			r.Name = c.Name
			out[i] = r
		}()
	}
	wg.Wait()
	return out
}

func runCheck(ctx context.Context, c Check) Result {
	switch c.Kind {
	case "proxy":
		return viaProxy(ctx, c.Target, c.Proxy)
	case "http":
		return directHTTP(ctx, c)
	case "tls":
		return directTLS(ctx, c)
	case "admin":
		return admin(ctx, c.Target)
	case "tcp":
		return directTCP(ctx, c)
	case "dns":
		return query(ctx, c)
	case "spoof":
		return spoofDNS(ctx, c)
	}
	return Result{Detail: "unknown check kind " + c.Kind}
}

func viaProxy(ctx context.Context, target, proxy string) Result {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", proxy)
	if err != nil {
		return Result{Detail: "proxy: " + err.Error()}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	br := bufio.NewReader(conn)
	if port == "80" {
		fmt.Fprintf(conn, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host)
		return originAnswer(br, "GET via proxy")
	}
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return Result{Detail: "CONNECT: " + err.Error()}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{Detail: "CONNECT: proxy answered " + resp.Status}
	}
	tc := tls.Client(&bufferedConn{Conn: conn, r: br}, &tls.Config{ServerName: host, InsecureSkipVerify: true}) //nolint:gosec // the fake internet's certificate is self-signed; the check is about reachability
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	return originAnswer(bufio.NewReader(tc), "GET through CONNECT tunnel")
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func originAnswer(br *bufio.Reader, what string) Result {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return Result{Detail: what + ": " + err.Error()}
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	detail := what + ": " + resp.Status
	if resp.StatusCode == http.StatusOK {
		return Result{Reachable: true, Detail: detail + " " + strings.TrimSpace(string(body))}
	}
	return Result{Detail: detail}
}

func admin(ctx context.Context, target string) Result {
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	// adminapi.PathPolicy, spelled out: importing adminapi would link the policy
	// language into a probe that only needs to show the path is out of reach.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target+"/v1/policy", nil)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	resp, err := client.Do(req)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"generation"`) {
		return Result{Reachable: true, Detail: "admin API answered: " + resp.Status}
	}
	return Result{Detail: "no admin API there (" + resp.Status + ")"}
}

func query(ctx context.Context, c Check) Result {
	network := c.Net
	if network == "" {
		network = "udp"
	}
	resp, err := exchange(ctx, network, c.Server, c.QName)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return Result{Reachable: true, Detail: network + " DNS: refused (the host answered)"}
	}
	if err != nil {
		return Result{Detail: network + " DNS: " + err.Error()}
	}
	r := Result{Reachable: true, Detail: network + " DNS: " + dns.RcodeToString[resp.Rcode]}
	if why, ok := refusalEDE(resp); ok {
		r.Refused = true
		r.Detail += " from the sidecar (" + why + ")"
	}
	for _, a := range answerA(resp) {
		r.Resolved = true
		r.Detail += " " + a
	}
	return r
}

// exchange asks server for qname's A record, with EDNS: the sidecar says why it
// refused only to an EDNS client.
func exchange(ctx context.Context, network, server, qname string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(qname), dns.TypeA)
	m.SetEdns0(dns.DefaultMsgSize, false)
	cl := &dns.Client{Net: network}
	// The client's own read timeout (2 s) would cut a longer timeout_ms short.
	if d, ok := ctx.Deadline(); ok {
		cl.Timeout = time.Until(d)
	}
	resp, _, err := cl.ExchangeContext(ctx, m, server)
	return resp, err
}

func answerA(resp *dns.Msg) []string {
	var out []string
	for _, a := range resp.Answer {
		if rec, ok := a.(*dns.A); ok {
			out = append(out, rec.A.String())
		}
	}
	return out
}
