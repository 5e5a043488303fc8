package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/policy"
)

var allowA = policy.Policy{Mode: policy.ModeAllowlist, Targets: []policy.Target{{Kind: policy.KindHost, Host: "a.test"}}}

// A 200 answer to PUT /v1/policy counts as an acknowledgement only if it names the
// policy's digest and a generation.
func TestPutPolicyRequiresDigestAndGeneration(t *testing.T) {
	want := allowA.Digest()
	tests := []struct {
		name, body string
		ok         bool
	}{
		{"full ack", fmt.Sprintf(`{"generation":2,"digest":%q}`, want), true},
		{"empty body", `{}`, false},
		{"no digest", `{"generation":2}`, false},
		{"generation 0", fmt.Sprintf(`{"generation":0,"digest":%q}`, want), false},
		{"other digest", `{"generation":2,"digest":"sha256:other"}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			socket := serveAdmin(t, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, tc.body) })
			_, err := NewClient(socket, nil).PutPolicy(context.Background(), allowA, "t", "run")
			if tc.ok != (err == nil) {
				t.Fatalf("PutPolicy(%s) error = %v, want ok %t", tc.body, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name the wanted digest", err)
			}
		})
	}
}

// The sidecar's answer to PUT /v1/policy carries the policy in canonical form, as long
// as the body that put it: an allowlist of 100k entries (about 2 MiB) is acknowledged,
// not taken for a failed swap, as it is by GET /v1/policy.
func TestAdminReadsLargeAnswers(t *testing.T) {
	hosts := make([]string, 100_000)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%d.example.test", i)
	}
	doc, _ := json.Marshal(map[string]any{"network_mode": "allowlist", "allowed_hosts": hosts})
	big, err := policy.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	ack, _ := json.Marshal(map[string]any{"generation": 2, "digest": big.Digest(), "mode": big.Mode, "policy": big})
	socket := serveAdmin(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write(ack)
	})
	c := NewClient(socket, nil)
	if _, err := c.PutPolicy(context.Background(), big, "t", "run"); err != nil {
		t.Errorf("PUT of a %d-byte answer: %v", len(ack), err)
	}
	if got, err := c.GetPolicy(context.Background()); err != nil || got.Digest != big.Digest() {
		t.Errorf("GET of a %d-byte answer: %v", len(ack), err)
	}
}

// serveAdmin serves handle on a unix socket, as the sidecar's admin API, until the test
// ends, and returns the socket's path.
func serveAdmin(t *testing.T, handle http.HandlerFunc) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "admin.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: handle}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return socket
}

// Every answer but a 200 is an error naming the request and the status, with the
// server's error body, or the body as text when it is not one; a 200 that does not
// decode is an error too.
func TestClientErrors(t *testing.T) {
	put := func(ctx context.Context, c *Client) error { _, err := c.PutPolicy(ctx, allowA, "t", "run"); return err }
	get := func(ctx context.Context, c *Client) error { _, err := c.GetPolicy(ctx); return err }
	blocked := func(ctx context.Context, c *Client) error { _, err := c.Blocked(ctx); return err }
	ready := func(ctx context.Context, c *Client) error { return c.Ready(ctx) }
	tests := []struct {
		name   string
		status int
		body   string
		call   func(context.Context, *Client) error
		want   string // the error, or its prefix when it ends in "..."
	}{
		{"error body with problems", 400, `{"error":"invalid policy; the running policy is unchanged","errors":["a: x","b: y"]}`, put,
			"admin: PUT /v1/policy: 400 Bad Request: invalid policy; the running policy is unchanged: a: x; b: y"},
		{"error body without problems", 413, `{"error":"policy too large","errors":[]}`, put,
			"admin: PUT /v1/policy: 413 Request Entity Too Large: policy too large"},
		{"plain text", 503, "not ready: draining\n", ready,
			"admin: GET /readyz: 503 Service Unavailable: not ready: draining"},
		{"JSON without an error", 500, `{"errors":["x"]}`, blocked,
			`admin: GET /v1/blocked: 500 Internal Server Error: {"errors":["x"]}`},
		{"empty", 404, "", get, "admin: GET /v1/policy: 404 Not Found: "},
		{"200 not JSON", 200, "ok", get, "admin: GET /v1/policy: decode: ..."},
		{"200 with a policy that does not parse", 200, `{"generation":1,"policy":{"network_mode":"sometimes"}}`, get,
			"admin: GET /v1/policy: decode: ..."},
		// The bound shrunk to 1 KiB: the test reads no 64 MiB.
		{"200 over the bound", 200, strings.Repeat(" ", 1025), blocked, "admin: GET /v1/blocked: answer larger than 1024 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			socket := serveAdmin(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			client := NewClient(socket, nil)
			client.maxAnswer = 1024
			err := tc.call(t.Context(), client)
			prefix, open := strings.CutSuffix(tc.want, "...")
			if err == nil || !open && err.Error() != tc.want || open && !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// A sidecar that does not answer, or is not there, is an error naming the request and
// wrapping the cause, within the caller's deadline.
func TestClientTimeoutsAndNoSidecar(t *testing.T) {
	socket := serveAdmin(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := NewClient(socket, nil).Blocked(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "admin: GET /v1/blocked: ") {
		t.Errorf("a sidecar that does not answer: %v, want a deadline error naming GET /v1/blocked", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the client waited %v past a deadline of 100ms", took)
	}

	err = NewClient(filepath.Join(t.TempDir(), "none.sock"), nil).Ready(t.Context())
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "admin: GET /readyz: ") {
		t.Errorf("no socket: %v, want a not-exist error naming GET /readyz", err)
	}
}

// The client sends each request as the server routes it: method, path, and for PUT a
// JSON envelope with both labels; every request goes through the wrapped transport.
func TestClientRequests(t *testing.T) {
	type seen struct{ method, path, contentType, body string }
	var got []seen
	socket := serveAdmin(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, seen{r.Method, r.URL.Path, r.Header.Get("Content-Type"), string(body)})
		if r.Method == http.MethodPut {
			fmt.Fprintf(w, `{"generation":2,"digest":%q}`, allowA.Digest())
		} else {
			fmt.Fprint(w, `{}`)
		}
	})
	trips := 0
	c := NewClient(socket, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) { trips++; return rt.RoundTrip(r) })
	})
	ctx := t.Context()
	if _, err := c.PutPolicy(ctx, allowA, "t1", "run"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Blocked(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{"PUT", PathPolicy, "application/json", `{"policy":{"network_mode":"allowlist","allowed_hosts":["a.test"]},"task":"t1","phase":"run"}`},
		{"GET", PathPolicy, "", ""},
		{"GET", PathBlocked, "", ""},
		{"GET", PathReadyz, "", ""},
	}
	if !reflect.DeepEqual(got, want) || trips != len(want) {
		t.Errorf("requests %q through %d round trips, want %q through %d", got, trips, want, len(want))
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
