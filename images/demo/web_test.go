package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHTTPAttemptReachedOnlyWhenTheDestinationAnswers: a reply that is not the fake
// internet's own (the sidecar's refusal, any other stand-in) is blocked, not reached.
func TestHTTPAttemptReachedOnlyWhenTheDestinationAnswers(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		wantErr string
	}{
		{"the fake internet", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("fakenet " + r.Host + "\n")) }, ""},
		{"the sidecar's refusal", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Compass-Egress", "error; reason=not-allowlisted")
			w.WriteHeader(http.StatusForbidden)
		}, "HTTP 403 from the sidecar (error; reason=not-allowlisted)"},
		{"an error from elsewhere", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "nope", http.StatusBadGateway) }, "HTTP 502: nope"},
		{"a success from something else", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello")) }, "not from the destination"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			body, err := httpAttempt(http.MethodPost, srv.URL+"/upload", route{})
			if tt.wantErr == "" {
				if err != nil || !strings.HasPrefix(body, fakenetPrefix) {
					t.Fatalf("body %q, %v; want the destination's answer", body, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestHTTPAttemptDialsThePinnedAddress: with dialAddr the request names the URL's host
// but goes to that address, as a hard-coded hosts entry sends it.
func TestHTTPAttemptDialsThePinnedAddress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("fakenet " + r.Host + "\n"))
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	body, err := httpAttempt(http.MethodGet, "http://exfil.test:"+port+"/", route{dialAddr: host})
	if err != nil || body != "fakenet exfil.test:"+port+"\n" {
		t.Fatalf("body %q, %v; want the answer for exfil.test from %s", body, err, host)
	}
}
