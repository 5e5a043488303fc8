package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/internal/testutil"
)

// runMainEnv makes the test binary run the real main instead of the tests: the process
// tests start it so as to send it real signals (see startProxy).
const runMainEnv = "COMPASS_PROXY_TEST_RUN_MAIN"

// hangGuard bounds a test's wait for something the proxy must do (start, answer, log,
// exit). It is far above any time a slow or loaded machine plausibly takes, so that
// reaching it means the event never came, not that it came late: how long things take
// belongs in benchmarks, not in assertions.
const hangGuard = time.Minute

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

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
			if c.Listen != ":3128" || c.DNSListen != ":53" || c.MetricsListen != "" || c.TransparentListen != "" || c.AdminSocket != "/run/compass/admin.sock" ||
				!c.RequireNoForwarding || c.MaxConnections != 4096 || c.DNSTimeout != 2*time.Second || c.PolicyFile != "" ||
				o.logFlush != 100*time.Millisecond {
				t.Fatalf("%+v, log flush %v", c, o.logFlush)
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
		{"transparent-listen from env", nil, map[string]string{"COMPASS_PROXY_TRANSPARENT_LISTEN": ":15001"}, func(t *testing.T, o *options) {
			if o.cfg.TransparentListen != ":15001" {
				t.Fatalf("%+v", o.cfg)
			}
		}, ""},
		{"deny-private from env", nil, map[string]string{"COMPASS_PROXY_DENY_PRIVATE": "true"}, func(t *testing.T, o *options) {
			if !o.cfg.DenyPrivate {
				t.Fatalf("%+v", o.cfg)
			}
		}, ""},
		{"deny-private off by default", nil, nil, func(t *testing.T, o *options) {
			if o.cfg.DenyPrivate {
				t.Fatalf("%+v", o.cfg)
			}
		}, ""},
		{"bad cidr", []string{"--allow-internal", "nope"}, nil, nil, "not a CIDR"},
		{"resolv.conf upstreams by default", nil, nil, func(t *testing.T, o *options) {
			if strings.Join(o.cfg.DNSUpstreams, " ") != "10.9.9.9:53" {
				t.Fatalf("%q", o.cfg.DNSUpstreams)
			}
		}, ""},
		// A bare address (as resolv.conf writes it) used to start and then fail every
		// lookup on "missing port".
		{"bare upstream gets port 53", []string{"--dns-upstream", "127.0.0.1,fd00::2,[fd00::3],[::1]:5353,10.0.0.1:54"}, nil, func(t *testing.T, o *options) {
			if got := strings.Join(o.cfg.DNSUpstreams, " "); got != "127.0.0.1:53 [fd00::2]:53 [fd00::3]:53 [::1]:5353 10.0.0.1:54" {
				t.Fatalf("%q", got)
			}
		}, ""},
		{"upstream name", []string{"--dns-upstream", "dns.test:53"}, nil, nil, `--dns-upstream: "dns.test:53": want an IP address`},
		{"upstream name from env", nil, map[string]string{"COMPASS_PROXY_DNS_UPSTREAM": "10.0.0.1,dns.test"}, nil, `COMPASS_PROXY_DNS_UPSTREAM: "dns.test": want an IP address`},
		// An explicitly empty list fell back to resolv.conf as if it were unset.
		{"empty upstream", []string{"--dns-upstream="}, nil, nil, "--dns-upstream: empty"},
		{"empty upstream from env", nil, map[string]string{"COMPASS_PROXY_DNS_UPSTREAM": " , "}, nil, "COMPASS_PROXY_DNS_UPSTREAM: empty"},
		{"upstream port 0", []string{"--dns-upstream", "10.0.0.1:0"}, nil, nil, `--dns-upstream: "10.0.0.1:0": port 0`},
		{"upstream bad port", []string{"--dns-upstream", "10.0.0.1:dns"}, nil, nil, `--dns-upstream: "10.0.0.1:dns"`},
		{"empty listen", []string{"--listen="}, nil, nil, "--listen: empty"},
		{"empty listen from env", nil, map[string]string{"COMPASS_PROXY_LISTEN": ""}, nil, "COMPASS_PROXY_LISTEN: empty"},
		{"empty admin socket", nil, map[string]string{"COMPASS_PROXY_ADMIN_SOCKET": ""}, nil, "COMPASS_PROXY_ADMIN_SOCKET: empty"},
		{"negative drain timeout", []string{"--drain-timeout=-1s"}, nil, nil, "--drain-timeout: -1s: must be positive"},
		{"zero idle timeout from env", nil, map[string]string{"COMPASS_PROXY_IDLE_TIMEOUT": "0s"}, nil, "COMPASS_PROXY_IDLE_TIMEOUT: 0s: must be positive"},
		{"zero dns timeout", []string{"--dns-timeout", "0"}, nil, nil, "--dns-timeout: 0s: must be positive"},
		{"negative max connections", []string{"--max-connections=-1"}, nil, nil, "--max-connections: -1: must not be negative"},
		{"zero dns inflight", []string{"--dns-max-inflight=0"}, nil, nil, "--dns-max-inflight: 0: must be positive"},
		{"zero max connections is unbounded", []string{"--max-connections=0"}, nil, func(t *testing.T, o *options) {
			if o.cfg.MaxConnections != 0 {
				t.Fatalf("%d", o.cfg.MaxConnections)
			}
		}, ""},
		{"bad cidr from env", nil, map[string]string{"COMPASS_PROXY_ALLOW_INTERNAL": "10.0.0.0/33"}, nil, `COMPASS_PROXY_ALLOW_INTERNAL: "10.0.0.0/33": not a CIDR`},
		{"bad log level", []string{"--log-level", "verbose"}, nil, nil, `--log-level: "verbose": want debug, info, warn or error`},
		{"bad log level from env", nil, map[string]string{"COMPASS_PROXY_LOG_LEVEL": "verbose"}, nil, `COMPASS_PROXY_LOG_LEVEL: "verbose"`},
		{"log level", nil, map[string]string{"COMPASS_PROXY_LOG_LEVEL": "warn"}, func(t *testing.T, o *options) {
			if o.level != slog.LevelWarn {
				t.Fatalf("%v", o.level)
			}
		}, ""},
		{"negative log flush interval", []string{"--log-flush-interval=-1ms"}, nil, nil, "--log-flush-interval: -1ms: must be between 0 and 10s"},
		{"log flush interval just below 0", []string{"--log-flush-interval=-1ns"}, nil, nil, "--log-flush-interval: -1ns: must be between 0 and 10s"},
		{"log flush interval above the bound", nil, map[string]string{"COMPASS_PROXY_LOG_FLUSH_INTERVAL": "1m"}, nil, "COMPASS_PROXY_LOG_FLUSH_INTERVAL: 1m0s: must be between 0 and 10s"},
		{"unbuffered log", nil, map[string]string{"COMPASS_PROXY_LOG_FLUSH_INTERVAL": "0"}, func(t *testing.T, o *options) {
			if o.logFlush != 0 {
				t.Fatalf("%v", o.logFlush)
			}
		}, ""},
		{"help", []string{"--help"}, nil, nil, flag.ErrHelp.Error()},
		{"bad env duration", nil, map[string]string{"COMPASS_PROXY_DIAL_TIMEOUT": "soon"}, nil, "COMPASS_PROXY_DIAL_TIMEOUT"},
		// The flag package stores the zero value on a parse error, which for these is a
		// valid setting (unbounded, the forwarding check off): only the error stops it.
		{"bad env count", nil, map[string]string{"COMPASS_PROXY_MAX_CONNECTIONS": "lots"}, nil, "COMPASS_PROXY_MAX_CONNECTIONS: parse error"},
		{"bad env bool", nil, map[string]string{"COMPASS_PROXY_REQUIRE_NO_FORWARDING": "yes please"}, nil, "COMPASS_PROXY_REQUIRE_NO_FORWARDING: parse error"},
		{"unknown flag", []string{"--nope"}, nil, nil, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, nil, nil, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, resolvConf(t, "nameserver 10.9.9.9\n"))
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

// resolvConf is a resolv.conf holding content.
func resolvConf(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// With no --dns-upstream and no nameserver in resolv.conf the proxy used to start, report
// ready and fail every lookup.
func TestNoUpstreamRefused(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, path := range []string{resolvConf(t, "# no nameserver\noptions ndots:0\n"), filepath.Join(t.TempDir(), "missing")} {
		_, err := parse(nil, none, path)
		if err == nil || !strings.Contains(err.Error(), "no DNS upstream") || !strings.Contains(err.Error(), "--dns-upstream") ||
			!strings.Contains(err.Error(), "COMPASS_PROXY_DNS_UPSTREAM") || !strings.Contains(err.Error(), path) {
			t.Fatalf("%s: %v", path, err)
		}
		if _, err := parse([]string{"--dns-upstream", "10.0.0.1"}, none, path); err != nil {
			t.Fatalf("%s with --dns-upstream: %v", path, err)
		}
	}
}

// --help used to print nothing and exit 1.
func TestUsage(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		if _, err := parse([]string{arg}, func(string) (string, bool) { return "", false }, "/nonexistent"); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s: %v", arg, err)
		}
	}
	var out bytes.Buffer
	usage(&out)
	for _, want := range []string{"COMPASS_PROXY_<FLAG>", "-listen string", `(default ":3128")`, "-drain-timeout duration", "healthcheck"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}

// A SIGHUP or SIGTERM that arrives while the proxy starts is handled once it is up: run
// installs the handlers before proxy.New (an early SIGHUP used to kill it with 129, an
// early SIGTERM to skip the drain).
func TestSignalsDuringStartup(t *testing.T) {
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policyFile, []byte(`"no-network"`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parse([]string{"--listen", "127.0.0.1:0", "--dns-listen=", "--admin-socket", filepath.Join(dir, "admin.sock"),
		"--dns-upstream", "127.0.0.1:1", "--require-no-forwarding=false", "--policy", policyFile, "--drain-timeout", "5s"},
		func(string) (string, bool) { return "", false }, "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	signals := make(chan os.Signal, 2)
	signals <- syscall.SIGHUP
	signals <- syscall.SIGTERM
	var logs testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- serve(o, &logs, signals) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("serve did not stop on SIGTERM")
	}
	for _, want := range []string{`"source":"sighup"`, `"msg":"draining","signal":"terminated","drain_timeout":"5s"`, `"msg":"stopped"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
}

func TestResolvConfServers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte("# x\nnameserver 127.0.0.11\nnameserver ::1\nnameserver bogus\noptions ndots:0\nsortlist 10.1.1.1\n"), 0o644); err != nil {
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
	// The socket's variable stands in for the flag, which wins over it.
	t.Setenv("COMPASS_PROXY_ADMIN_SOCKET", sock)
	if code := healthcheck(nil, &stderr); code != 0 {
		t.Fatalf("socket from the variable: exit %d (%s)", code, stderr.String())
	}
	if code := healthcheck([]string{"--admin-socket", sock + ".missing"}, &stderr); code != 1 {
		t.Fatalf("the variable won over --admin-socket: exit %d", code)
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

// On SIGTERM the batched log lines are written at once, and so is every line after
// them, while tunnels still hold the drain: a container runtime kills the proxy when its
// stop grace ends, and the lines batched by then would be lost. The batch's timer and
// the drain's deadline are both an hour, far beyond the test's hang guard, so the lines
// can only have come from the flush on SIGTERM, however slowly they came.
func TestDrainWritesLogLinesAtOnce(t *testing.T) {
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policyFile, []byte(`"public"`), 0o600); err != nil {
		t.Fatal(err)
	}
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := upstream.Accept(); err == nil {
			held <- c
		}
	}()
	// serve binds the address itself, so the test picks a free port first: on a loopback
	// address of its own, where no other test's outgoing connection can take the port
	// (their source address is 127.0.0.1) before serve binds it.
	free, err := net.Listen("tcp", "127.77.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := free.Addr().String()
	free.Close()
	o, err := parse([]string{"--listen", proxyAddr, "--dns-listen=", "--admin-socket", filepath.Join(dir, "admin.sock"),
		"--dns-upstream", "127.0.0.1:1", "--require-no-forwarding=false", "--policy", policyFile, "--drain-timeout", "1h",
		"--allow-internal", "127.0.0.0/8", "--log-flush-interval", "10s"},
		func(string) (string, bool) { return "", false }, "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	o.logFlush = time.Hour // beyond the flag's bound: no batch is written by its timer here
	signals := make(chan os.Signal, 1)
	var logs testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- serve(o, &logs, signals) }()
	var c net.Conn
	for start := time.Now(); c == nil; {
		if c, err = net.Dial("tcp", proxyAddr); err != nil && time.Since(start) > hangGuard {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	target := upstream.Addr().String()
	if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	up := <-held
	defer up.Close()

	signals <- syscall.SIGTERM
	wants := []string{`"msg":"decision","decision":"allowed"`, `"msg":"draining"`}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		missing := ""
		for _, want := range wants {
			if !strings.Contains(logs.String(), want) {
				missing = want
			}
		}
		if missing == "" {
			break
		}
		if time.Since(start) > hangGuard {
			t.Fatalf("%v after SIGTERM, with the drain held by a tunnel, the logs lack %s:\n%s", hangGuard, missing, logs.String())
		}
	}
	c.Close()
	up.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("serve did not stop once the tunnel closed")
	}
}
