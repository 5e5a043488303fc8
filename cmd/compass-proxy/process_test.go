package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/internal/testutil"
)

// The real process, through signal.Notify: SIGHUP re-reads --policy (a broken file is
// rejected, counted and the running policy stays), /livez and /readyz answer on the
// admin socket and on --metrics-listen, the healthcheck subcommand asks the live
// sidecar, and SIGTERM drains to exit status 0.
func TestProcessSignals(t *testing.T) {
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.json")
	sock := filepath.Join(dir, "admin.sock")
	writeFile(t, policyFile, `"no-network"`)
	p := startProxy(t, sock, "--listen", "127.0.0.1:0", "--dns-listen=", "--dns-upstream", "127.0.0.1:1",
		"--metrics-listen", "127.0.0.1:0", "--policy", policyFile,
		"--require-no-forwarding=false", "--log-flush-interval=0", "--drain-timeout=2s")
	p.waitUntil(t, "ready on the admin socket", func() bool { code, _ := get(p.admin, "http://admin/readyz"); return code == 200 })
	metricsAddr := p.startedField(t, "metrics_listen")

	metrics := &http.Client{Timeout: hangGuard, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, probe := range []struct {
		client *http.Client
		url    string
	}{
		{p.admin, "http://admin/livez"}, {p.admin, "http://admin/readyz"},
		{metrics, "http://" + metricsAddr + "/livez"}, {metrics, "http://" + metricsAddr + "/readyz"},
	} {
		if code, body := get(probe.client, probe.url); code != 200 {
			t.Errorf("%s: %d %q, want 200", probe.url, code, body)
		}
	}
	if code, out := runSubcommand(t, "healthcheck", "--admin-socket", sock); code != 0 {
		t.Errorf("healthcheck against the ready sidecar: exit %d: %s", code, out)
	}
	if st := p.policyStatus(t); st.Generation != 1 || st.Mode != "no-network" {
		t.Fatalf("at start: generation %d mode %s", st.Generation, st.Mode)
	}

	writeFile(t, policyFile, `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	p.signal(t, syscall.SIGHUP)
	p.waitUntil(t, "new generation after SIGHUP", func() bool { return p.policyStatus(t).Generation != 1 })
	if st := p.policyStatus(t); st.Generation != 2 || st.Mode != "allowlist" {
		p.fatal(t, "after SIGHUP: generation %d mode %s, want 2 allowlist", st.Generation, st.Mode)
	}

	writeFile(t, policyFile, `{"network_mode":"allowlist"}`)
	p.signal(t, syscall.SIGHUP)
	failures := `compass_proxy_policy_reloads_total{result="failure"}`
	p.waitUntil(t, "failed reload counted after SIGHUP", func() bool { return p.metricValue(t, failures) != "0" })
	for name, want := range map[string]string{
		failures: "1",
		`compass_proxy_policy_reloads_total{result="success"}`: "2",
		"compass_proxy_config_last_reload_successful":          "0",
		"compass_proxy_policy_generation":                      "2",
	} {
		if got := p.metricValue(t, name); got != want {
			t.Errorf("after a broken file and SIGHUP: %s %s, want %s", name, got, want)
		}
	}
	if st := p.policyStatus(t); st.Generation != 2 || st.Mode != "allowlist" {
		t.Fatalf("a broken file replaced the policy: generation %d mode %s", st.Generation, st.Mode)
	}

	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("%s after SIGTERM, want exit status 0\n%s", p.state, p.logs.String())
	}
	for _, want := range []string{`"msg":"policy rejected; the previous policy stays in force","source":"sighup"`,
		`"msg":"draining","signal":"terminated"`, `"msg":"stopped"`} {
		if !strings.Contains(p.logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, p.logs.String())
		}
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("admin socket left behind: %v", err)
	}
	if code, _ := runSubcommand(t, "healthcheck", "--admin-socket", sock); code != 1 {
		t.Errorf("healthcheck after exit: exit %d, want 1", code)
	}
}

// proxyProcess is the real program running as a child process.
type proxyProcess struct {
	cmd    *exec.Cmd
	admin  *http.Client         // on its admin socket
	logs   *testutil.SyncBuffer // stderr
	exited chan struct{}
	code   int
	state  string // how it ended, e.g. "signal: hangup"
}

// childEnv is the test's environment without COMPASS_PROXY_* variables (they would set
// flags) and with runMainEnv, so the test binary runs main. Under -race the child would
// sleep a second at exit (the detector's atexit_sleep_ms); a race it finds still makes
// its exit status 66.
func childEnv() []string {
	var env []string
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "GORACE="); ok {
			gorace = v + " " + gorace
			continue
		}
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, runMainEnv+"=1", "GORACE="+gorace)
}

func startProxy(t *testing.T, socket string, args ...string) *proxyProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args = append([]string{"--admin-socket", socket}, args...)
	p := &proxyProcess{cmd: exec.Command(exe, args...), admin: unixClient(socket), logs: &testutil.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = childEnv()
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.exited)
		_ = p.cmd.Wait()
		p.code, p.state = p.cmd.ProcessState.ExitCode(), p.cmd.ProcessState.String()
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

func (p *proxyProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("kill -%s: %v", sig, err)
	}
}

// wait is the exit status, once the process has exited.
func (p *proxyProcess) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(hangGuard):
		p.fatal(t, "still running %v after SIGTERM", hangGuard)
		return -1
	}
}

// fatal fails the test, saying whether the process has ended (a request to it failing
// is most often that), and with its log.
func (p *proxyProcess) fatal(t *testing.T, format string, a ...any) {
	t.Helper()
	ended := "the process is running"
	select {
	case <-p.exited:
		ended = "the process ended: " + p.state
	case <-time.After(time.Second):
	}
	t.Fatalf(format+" (%s)\n%s", append(a, ended, p.logs.String())...)
}

// waitUntil polls cond until the hang guard.
func (p *proxyProcess) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			p.fatal(t, "no %s within %v", what, hangGuard)
		}
	}
}

// runSubcommand runs the real program with args to its end: its exit status and output.
func runSubcommand(t *testing.T, args ...string) (int, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = childEnv()
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%s: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// startedField is a field of the start-up log line, which names the bound listeners.
// The line may come just after the proxy is ready.
func (p *proxyProcess) startedField(t *testing.T, name string) string {
	t.Helper()
	var rec map[string]any
	p.waitUntil(t, "start-up line", func() bool {
		for _, line := range strings.Split(p.logs.String(), "\n") {
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "compass-proxy started" {
				return true
			}
		}
		return false
	})
	v, _ := rec[name].(string)
	if v == "" || strings.HasSuffix(v, ":0") {
		p.fatal(t, "start-up line has %s %v, want the bound address", name, rec[name])
	}
	return v
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func unixClient(socket string) *http.Client {
	return &http.Client{Timeout: hangGuard, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

// get is the status and body of a GET; status 0 when the request failed (not listening
// yet).
func get(client *http.Client, url string) (int, string) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (p *proxyProcess) policyStatus(t *testing.T) adminapi.PolicyStatus {
	t.Helper()
	code, body := get(p.admin, "http://admin/v1/policy")
	var st adminapi.PolicyStatus
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		p.fatal(t, "GET /v1/policy: %d %v: %s", code, err, body)
	}
	return st
}

// metricValue is the value of the series name (with its labels, as exposed) in the
// admin socket's /metrics, "" when absent.
func (p *proxyProcess) metricValue(t *testing.T, name string) string {
	t.Helper()
	code, body := get(p.admin, "http://admin/metrics")
	if code != 200 {
		p.fatal(t, "GET /metrics: %d: %s", code, body)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}
