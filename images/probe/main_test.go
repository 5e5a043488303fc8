package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The checks run in goroutines and the fakes serve in goroutines: none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the output")

// golden compares got with testdata/name (or rewrites it under -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (-update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestRunRefusesBadInput: bad commands and specs are exit status 2 with a message on
// stderr and nothing on stdout (the callers decode stdout as the results).
func TestRunRefusesBadInput(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no command", nil, "usage: probe sleep | check JSON | stream URL [PROXY] [SECONDS] [READY]"},
		{"unknown command", []string{"ping"}, "probe: unknown command ping"},
		{"check without spec", []string{"check"}, "usage: probe check JSON"},
		{"check with two specs", []string{"check", "[]", "[]"}, "usage: probe check JSON"},
		{"check spec not JSON", []string{"check", "tcp 127.0.0.1:1"}, "probe: bad checks: invalid character"},
		{"check spec an object", []string{"check", `{"name":"a","kind":"tcp"}`}, "probe: bad checks: json: cannot unmarshal object"},
		{"check spec wrong type", []string{"check", `[{"name":"a","timeout_ms":"5"}]`}, "probe: bad checks: json: cannot unmarshal string"},
		{"stream without URL", []string{"stream"}, "usage: probe stream URL [PROXY] [SECONDS] [READY]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit status %d, want 2", code)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			if !strings.HasPrefix(stderr.String(), tc.stderr) {
				t.Errorf("stderr %q, want it to start with %q", stderr.String(), tc.stderr)
			}
		})
	}
}

// TestCheckOutput: `probe check` prints one JSON array, a result per check in the
// order of the checks: the format verify and the e2e tests decode (probespec).
func TestCheckOutput(t *testing.T) {
	allow := startProxy(t, http.StatusOK)
	deny := startProxy(t, http.StatusForbidden)
	dnsUDP, dnsTCP := startDNS(t)
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/policy" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"generation":1}`)
	}))
	t.Cleanup(admin.Close)
	web := strings.TrimPrefix(admin.URL, "http://")
	checks := []Check{
		{Name: "allowed https", Kind: "proxy", Target: "a.test:443", Proxy: allow.Addr},
		{Name: "allowed http", Kind: "proxy", Target: "a.test:80", Proxy: allow.Addr},
		{Name: "blocked https", Kind: "proxy", Target: "b.test:443", Proxy: deny.Addr},
		{Name: "blocked http", Kind: "proxy", Target: "b.test:80", Proxy: deny.Addr},
		{Name: "dns", Kind: "dns", Server: dnsUDP, QName: "a.test"},
		{Name: "dns tcp nxdomain", Kind: "dns", Net: "tcp", Server: dnsTCP, QName: "b.test"},
		{Name: "direct http", Kind: "http", Target: web},
		{Name: "tcp", Kind: "tcp", Target: web},
		{Name: "tcp refused", Kind: "tcp", Target: closedTCP(t)},
		{Name: "admin", Kind: "admin", Target: web},
		{Name: "unknown", Kind: "ping", Target: web},
	}
	spec, err := json.Marshal(checks)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", string(spec)}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
		t.Fatalf("exit status %d, stderr %q", code, stderr.String())
	}
	golden(t, "check.golden", stdout.Bytes())
}

// TestStreamOutput: `probe stream` prints one JSON object (the times, which vary, are
// checked by TestStream and zeroed here).
func TestStreamOutput(t *testing.T) {
	tests := []struct {
		name, golden string
		args         func(t *testing.T) []string
	}{
		{"closed by the peer", "stream-closed.golden", func(t *testing.T) []string {
			return []string{"stream", "http://" + serveHTTP(t, nil, func(c net.Conn) { fmt.Fprint(c, shortAnswer) }) + "/stream"}
		}},
		{"refused", "stream-refused.golden", func(t *testing.T) []string {
			return []string{"stream", "http://stream.test/stream", closedTCP(t), "1"}
		}},
	}
	times := regexp.MustCompile(`("(first_byte|last_byte|ended)_unix_ms"):[1-9][0-9]*`)
	addr := regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args(t), &stdout, &stderr); code != 0 || stderr.Len() != 0 {
				t.Fatalf("exit status %d, stderr %q", code, stderr.String())
			}
			out := times.ReplaceAll(stdout.Bytes(), []byte("$1:1"))
			golden(t, tc.golden, addr.ReplaceAll(out, []byte("127.0.0.1:PORT")))
		})
	}
}
