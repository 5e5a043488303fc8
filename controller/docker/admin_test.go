package docker

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
			socket := filepath.Join(t.TempDir(), "admin.sock")
			l, err := net.Listen("unix", socket)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, tc.body)
			})}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = srv.Serve(l)
			}()
			defer func() {
				_ = srv.Close()
				<-done
			}()
			_, err = newAdminClient(socket).PutPolicy(context.Background(), allowA, "t", "run")
			if tc.ok != (err == nil) {
				t.Fatalf("PutPolicy(%s) error = %v, want ok %t", tc.body, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name the wanted digest", err)
			}
		})
	}
}
