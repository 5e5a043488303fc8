package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// fakenetPrefix begins every body the fake internet serves ("fakenet HOST"): a reply that
// lacks it came from something else on the way, such as the sidecar.
const fakenetPrefix = "fakenet "

// route is how an HTTP attempt leaves the agent.
type route struct {
	viaProxy   bool   // through the proxy variables; else straight out, as if they were unset
	serverName string // TLS server name in place of the URL's host, if set
	dialAddr   string // connect to this address in place of the URL host's, if set
}

// httpAttempt sends one request along r and returns the body. It fails unless the fake
// internet itself answered, so that a refusal by the sidecar (an HTTP 403 naming its
// reason) or any other stand-in counts as blocked.
func httpAttempt(method, url string, r route) (string, error) {
	// The fake internet's certificate is self-signed.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: r.serverName}}
	if r.viaProxy {
		tr.Proxy = http.ProxyFromEnvironment
	}
	if r.dialAddr != "" {
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(r.dialAddr, port))
		}
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("answer=42")
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	text := strings.TrimSpace(string(b))
	if resp.StatusCode >= 400 {
		if why := resp.Header.Get("X-Compass-Egress"); why != "" {
			return "", fmt.Errorf("HTTP %d from the sidecar (%s)", resp.StatusCode, why)
		}
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, text)
	}
	if !strings.HasPrefix(text, fakenetPrefix) {
		return "", fmt.Errorf("HTTP %d, but not from the destination: %.60q", resp.StatusCode, text)
	}
	return string(b), nil
}
