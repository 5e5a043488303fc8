package docker

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

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// adminClient talks to one sidecar's admin API over its unix socket, the only place the
// API listens (so the agent, which shares no filesystem with it, cannot reach it).
type adminClient struct {
	socket string
	http   *http.Client
}

func newAdminClient(socket string) *adminClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	return &adminClient{socket: socket, http: &http.Client{Transport: tr, Timeout: 15 * time.Second}}
}

// policyAck is the sidecar's answer to PUT and GET /v1/policy.
type policyAck struct {
	Generation        uint64          `json:"generation"`
	Digest            string          `json:"digest"`
	Mode              policy.Mode     `json:"mode"`
	Policy            json.RawMessage `json:"policy"`
	Task              string          `json:"task"`
	Phase             string          `json:"phase"`
	ClosedConnections uint64          `json:"closed_connections"`
	// PreviousBlocked (PUT only) is the outgoing generation's blocked summary, taken
	// atomically with the swap; absent on the first policy a sidecar gets.
	PreviousBlocked *controller.BlockedSummary `json:"previous_blocked,omitempty"`
}

// maxAdminAnswer bounds what the client reads of an answer. PUT and GET /v1/policy
// answer with the policy in canonical form, which is as long as the body that put it:
// up to the 32 MiB the sidecar takes (an allowlist of 100k entries is 2 to 25 MiB).
const maxAdminAnswer = 64 << 20

type adminError struct {
	Error  string   `json:"error"`
	Errors []string `json:"errors"`
}

func (a *adminClient) do(ctx context.Context, method, path string, body any, out any) error {
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
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminAnswer+1))
	if err != nil {
		return fmt.Errorf("admin: %s %s: read: %w", method, path, err)
	}
	if len(data) > maxAdminAnswer {
		return fmt.Errorf("admin: %s %s: answer larger than %d bytes", method, path, maxAdminAnswer)
	}
	if resp.StatusCode != http.StatusOK {
		var ae adminError
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

// PutPolicy puts p in force and returns the sidecar's acknowledgement.
func (a *adminClient) PutPolicy(ctx context.Context, p policy.Policy, task, phase string) (policyAck, error) {
	body := struct {
		Policy policy.Policy `json:"policy"`
		Task   string        `json:"task"`
		Phase  string        `json:"phase"`
	}{p, task, phase}
	var ack policyAck
	if err := a.do(ctx, http.MethodPut, "/v1/policy", body, &ack); err != nil {
		return policyAck{}, err
	}
	// Only an answer naming this policy and the generation it started is proof the
	// rules are in force; an empty or partial 200 is not.
	if ack.Digest != p.Digest() || ack.Generation == 0 {
		return ack, fmt.Errorf("admin: sidecar acknowledged digest %q generation %d, want digest %s and a generation above 0", ack.Digest, ack.Generation, p.Digest())
	}
	return ack, nil
}

// GetPolicy returns the policy in force.
func (a *adminClient) GetPolicy(ctx context.Context) (policyAck, error) {
	var ack policyAck
	err := a.do(ctx, http.MethodGet, "/v1/policy", nil, &ack)
	return ack, err
}

// Blocked returns the blocked attempts of the generation in force.
func (a *adminClient) Blocked(ctx context.Context) (controller.BlockedSummary, error) {
	var s controller.BlockedSummary
	err := a.do(ctx, http.MethodGet, "/v1/blocked", nil, &s)
	return s, err
}

// Ready reports whether the sidecar answers /readyz with 200.
func (a *adminClient) Ready(ctx context.Context) error {
	return a.do(ctx, http.MethodGet, "/readyz", nil, nil)
}
