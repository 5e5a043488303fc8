package adminapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
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
