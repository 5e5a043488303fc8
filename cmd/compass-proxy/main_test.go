package main

import (
	"bytes"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlagsAndEnvironment(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(*testing.T, *options)
		err   string
	}{
		{"defaults", nil, nil, func(t *testing.T, o *options) {
			c := o.cfg
			if c.Listen != ":3128" || c.DNSListen != ":53" || c.MetricsListen != "" || c.AdminSocket != "/run/compass/admin.sock" ||
				!c.RequireNoForwarding || c.MaxConnections != 4096 || c.DNSTimeout != 2*time.Second || c.PolicyFile != "" {
				t.Fatalf("%+v", c)
			}
		}, ""},
		{"env fills flags", nil, map[string]string{
			"COMPASS_PROXY_LISTEN": "127.0.0.1:1", "COMPASS_PROXY_DNS_UPSTREAM": "10.0.0.1:53, 10.0.0.2:53",
			"COMPASS_PROXY_ALLOW_INTERNAL": "127.0.0.0/8,::1", "COMPASS_PROXY_REQUIRE_NO_FORWARDING": "false",
			"COMPASS_PROXY_DNS_LISTEN": "", "COMPASS_PROXY_TASK": "t7", "COMPASS_PROXY_IDLE_TIMEOUT": "3s",
		}, func(t *testing.T, o *options) {
			c := o.cfg
			if c.Listen != "127.0.0.1:1" || strings.Join(c.DNSUpstreams, " ") != "10.0.0.1:53 10.0.0.2:53" || c.RequireNoForwarding ||
				c.DNSListen != "" || c.Task != "t7" || c.IdleTimeout != 3*time.Second ||
				len(c.AllowInternal) != 2 || c.AllowInternal[1] != netip.MustParsePrefix("::1/128") {
				t.Fatalf("%+v", c)
			}
		}, ""},
		{"flag wins over env", []string{"--listen", "127.0.0.1:2", "--dns-upstream", "10.0.0.3:53", "--dns-upstream=10.0.0.4:53"},
			map[string]string{"COMPASS_PROXY_LISTEN": "127.0.0.1:1", "COMPASS_PROXY_DNS_UPSTREAM": "10.0.0.1:53"},
			func(t *testing.T, o *options) {
				if o.cfg.Listen != "127.0.0.1:2" || strings.Join(o.cfg.DNSUpstreams, " ") != "10.0.0.3:53 10.0.0.4:53" {
					t.Fatalf("%+v", o.cfg)
				}
			}, ""},
		{"bad cidr", []string{"--allow-internal", "nope"}, nil, nil, "not a CIDR"},
		{"bad env duration", nil, map[string]string{"COMPASS_PROXY_DIAL_TIMEOUT": "soon"}, nil, "COMPASS_PROXY_DIAL_TIMEOUT"},
		{"unknown flag", []string{"--nope"}, nil, nil, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, nil, nil, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

func TestResolvConfServers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte("# x\nnameserver 127.0.0.11\nnameserver ::1\nnameserver bogus\noptions ndots:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(resolvConfServers(path), " "); got != "127.0.0.11:53 [::1]:53" {
		t.Fatalf("%q", got)
	}
}

func TestHealthcheckExitCode(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	var stderr bytes.Buffer
	if code := healthcheck([]string{"--admin-socket", sock}, &stderr); code != 1 {
		t.Fatalf("no socket: exit %d", code)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	ready.Store(true)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}), ReadHeaderTimeout: time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	defer func() { srv.Close(); <-done }()
	if code := healthcheck([]string{"--admin-socket", sock}, &stderr); code != 0 {
		t.Fatalf("ready: exit %d (%s)", code, stderr.String())
	}
	ready.Store(false)
	if code := healthcheck([]string{"--admin-socket", sock}, &stderr); code != 1 {
		t.Fatalf("not ready: exit %d", code)
	}
}

func TestGCDefaultRespectsGOGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	setGCDefault(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != gcPercentDefault {
		t.Errorf("without GOGC: GC percent %d, want %d", got, gcPercentDefault)
	}
	setGCDefault(func(k string) string {
		if k == "GOGC" {
			return "50"
		}
		return ""
	})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set: GC percent changed to %d", got)
	}
}
