package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/compass-egress/compass-egress/policy"
)

// Client talks to one sidecar's admin API over its unix socket, the only place the
// API listens (so the agent, which shares no filesystem with it, cannot reach it).
type Client struct {
	http      *http.Client
	maxAnswer int // bytes read of an answer at most
}

// requestTimeout bounds one request, answer included.
const requestTimeout = 15 * time.Second

// maxAnswer bounds what the client reads of an answer. PUT and GET PathPolicy answer
// with the policy in canonical form, which is as long as the body that put it: up to
// MaxPolicyBody (an allowlist of 100k entries is 2 to 25 MiB).
const maxAnswer = 2 * MaxPolicyBody

// NewClient is a client of the admin API listening on socket. wrap, if not nil, wraps
// its transport (tests inject faults with it).
func NewClient(socket string, wrap func(http.RoundTripper) http.RoundTripper) *Client {
	var tr http.RoundTripper = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	if wrap != nil {
		tr = wrap(tr)
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: requestTimeout}, maxAnswer: maxAnswer}
}

// PutPolicy puts p in force with the given labels and returns the sidecar's
// acknowledgement.
func (c *Client) PutPolicy(ctx context.Context, p policy.Policy, task, phase string) (ApplyResult, error) {
	var ack ApplyResult
	if err := c.do(ctx, http.MethodPut, PathPolicy, PolicyRequest{p, task, phase}, &ack); err != nil {
		return ApplyResult{}, err
	}
	// Only an answer naming this policy and the generation it started is proof the
	// rules are in force; an empty or partial 200 is not.
	if ack.Digest != p.Digest() || ack.Generation == 0 {
		return ack, fmt.Errorf("admin: sidecar acknowledged digest %q generation %d, want digest %s and a generation above 0", ack.Digest, ack.Generation, p.Digest())
	}
	return ack, nil
}

// GetPolicy returns the policy in force.
func (c *Client) GetPolicy(ctx context.Context) (PolicyStatus, error) {
	var st PolicyStatus
	err := c.do(ctx, http.MethodGet, PathPolicy, nil, &st)
	return st, err
}

// Blocked returns the blocked attempts of the generation in force.
func (c *Client) Blocked(ctx context.Context) (BlockedSummary, error) {
	var s BlockedSummary
	err := c.do(ctx, http.MethodGet, PathBlocked, nil, &s)
	return s, err
}

// Ready returns nil when the sidecar answers PathReadyz with 200, else why not.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, PathReadyz, nil, nil)
}

// do sends body (JSON, if not nil) and decodes a 200 answer into out (if not nil).
// Any other answer is an error that carries the status and the server's ErrorBody,
// or the body as text when it is not one.
func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("admin: encode: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://compass-proxy"+path, rd)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.maxAnswer)+1))
	if err != nil {
		return fmt.Errorf("admin: %s %s: read: %w", method, path, err)
	}
	if len(data) > c.maxAnswer {
		return fmt.Errorf("admin: %s %s: answer larger than %d bytes", method, path, c.maxAnswer)
	}
	if resp.StatusCode != http.StatusOK {
		var ae ErrorBody
		if json.Unmarshal(data, &ae) == nil && ae.Error != "" {
			detail := ae.Error
			if len(ae.Errors) > 0 {
				detail += ": " + strings.Join(ae.Errors, "; ")
			}
			return fmt.Errorf("admin: %s %s: %s: %s", method, path, resp.Status, detail)
		}
		return fmt.Errorf("admin: %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("admin: %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}
