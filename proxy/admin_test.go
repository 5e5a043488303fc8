package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/blocked"
)

func TestAdminPolicy(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Task, c.Phase = "t0", "baseline" })

	code, got := h.admin("GET", "/v1/policy", "")
	if code != 200 || got["mode"] != "no-network" || got["generation"] != float64(1) || got["task"] != "t0" || got["phase"] != "baseline" {
		t.Fatalf("initial: %d %v", code, got)
	}
	// Something blocked under generation 1 shows up as previous_blocked of the swap.
	if status, _ := h.connectStatus("a.test:443"); status != 403 {
		t.Fatalf("no-network CONNECT: %d", status)
	}

	code, got = h.admin("PUT", "/v1/policy", `{"network_mode":"allowlist","allowed_hosts":["A.test.","a.test"]}`)
	if code != 200 || got["generation"] != float64(2) || got["mode"] != "allowlist" || got["task"] != "t0" {
		t.Fatalf("bare PUT: %d %v", code, got)
	}
	want := policy.Policy{Mode: policy.ModeAllowlist, Targets: []policy.Target{{Kind: policy.KindHost, Host: "a.test"}}}
	if got["digest"] != want.Digest() {
		t.Fatalf("digest %v, want %s", got["digest"], want.Digest())
	}
	if fmt.Sprint(got["policy"]) != "map[allowed_hosts:[a.test] network_mode:allowlist]" {
		t.Fatalf("canonical policy %v", got["policy"])
	}
	prev, _ := got["previous_blocked"].(map[string]any)
	if prev["generation"] != float64(1) || prev["total"] != float64(1) {
		t.Fatalf("previous_blocked %v", got["previous_blocked"])
	}
	if top := prev["top"].([]any); len(top) != 1 || fmt.Sprint(top[0]) != "map[count:1 host:a.test port:443 reason:no-network type:connect]" {
		t.Fatalf("previous_blocked.top %v", prev["top"])
	}

	code, got = h.admin("PUT", "/v1/policy", `{"policy":"public","task":"t1","phase":"run"}`)
	if code != 200 || got["generation"] != float64(3) || got["task"] != "t1" || got["phase"] != "run" || got["policy"] != "public" {
		t.Fatalf("envelope PUT: %d %v", code, got)
	}
	if _, got = h.admin("GET", "/v1/policy", ""); got["phase"] != "run" || got["mode"] != "public" {
		t.Fatalf("GET after PUT: %v", got)
	}

	bad := []struct {
		body string
		want string // a substring of one of the errors
	}{
		{`{"network_mode":"allowlist","allowed_hosts":["https://x.test","ok.test","*"]}`, `allowed_hosts[0] "https://x.test": a URL scheme`},
		{`{"network_mode":"allowlist"}`, "allowed_hosts: is required"},
		{`{"network_mode":"public","allowed_hosts":[]}`, "takes no host list"},
		{`{"network_mode":"allowlist","allowed_hosts":[],"block_network":true}`, "provider-native"},
		{`"allowlist"`, "needs the object form"},
		{`{"policy":{"network_mode":"denylist","allowed_hosts":[]},"task":"t2"}`, "policy.allowed_hosts"},
		{`{"policy":"public","task":7}`, "task: must be a string"},
		{`{"policy":"public","owner":"x"}`, "owner: unknown key"},
		{`{"network_mode":"public","network_mode":"no-network"}`, "appears twice"},
		{`not json`, "invalid JSON"},
		{``, "invalid JSON"},
	}
	for _, b := range bad {
		code, got := h.admin("PUT", "/v1/policy", b.body)
		errs, _ := got["errors"].([]any)
		if code != 400 || got["error"] == nil || !strings.Contains(fmt.Sprint(errs), b.want) {
			t.Errorf("PUT %s: %d %v, want 400 mentioning %q", b.body, code, got, b.want)
		}
	}
	if _, got = h.admin("GET", "/v1/policy", ""); got["generation"] != float64(3) || got["mode"] != "public" {
		t.Fatalf("a rejected PUT changed the policy: %v", got)
	}
	if code, _ := h.admin("POST", "/v1/policy", `"public"`); code != 405 {
		t.Fatalf("POST: %d", code)
	}
	if code, _ := h.admin("GET", "/readyz", ""); code != 200 {
		t.Fatalf("readyz: %d", code)
	}
	if err := adminapi.NewClient(h.socket, nil).Ready(t.Context()); err != nil {
		t.Fatalf("healthcheck: %v", err)
	}
	fi, err := os.Stat(h.socket)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
}

func TestAdminBlockedSummary(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	for range 3 {
		h.connectStatus("b.test:443")
	}
	h.get(fmt.Sprintf("http://b.test:%d/", h.b.httpPort))
	h.query("evil.test", 1, "udp")
	// The DNS server counts a query after it has answered it.
	var got map[string]any
	waitFor(t, func() bool { _, got = h.admin("GET", "/v1/blocked", ""); return got["total"] == float64(5) })
	top := fmt.Sprint(got["top"])
	if got["generation"] != float64(2) || got["total"] != float64(5) ||
		!strings.HasPrefix(top, "[map[count:3 host:b.test port:443 reason:not-allowlisted type:connect]") ||
		!strings.Contains(top, "host:evil.test port:0 reason:not-allowlisted type:dns") {
		t.Fatalf("blocked %v", got)
	}
	// Bounded memory: many distinct targets keep at most the capacity (see
	// blocked.TestCounterIsBounded), and the endpoint lists at most blocked.Top.
	rs := h.srv.Current()
	for i := range blocked.Capacity + 100 {
		rs.blocked.Add(blocked.Key{Host: fmt.Sprintf("h%d.test", i), Port: 443, Type: typeConnect, Reason: "x"})
	}
	_, got = h.admin("GET", "/v1/blocked", "")
	if top, _ := got["top"].([]any); len(top) != blocked.Top || got["total"] != float64(5+blocked.Capacity+100) {
		t.Fatalf("blocked: %d top, total %v", len(top), got["total"])
	}
}

func TestStaleSocketAndStartupPolicy(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	leaveStaleSocket(t, sock)
	file := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(file, []byte(`{"network_mode":"denylist","denied_hosts":["b.test"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.AdminSocket, c.PolicyFile = sock, file })
	h.socket = sock
	if code, got := h.admin("GET", "/v1/policy", ""); code != 200 || got["mode"] != "denylist" {
		t.Fatalf("%d %v", code, got)
	}

	// SIGHUP's reload: a broken file keeps the running policy; a good one applies.
	if err := os.WriteFile(file, []byte(`{"network_mode":"denylist","denied_hosts":["x y"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(); err == nil {
		t.Fatal("a broken file reloaded")
	}
	if rs := h.srv.Current(); rs.Generation != 1 || rs.Mode() != policy.ModeDenylist {
		t.Fatalf("after broken reload: generation %d mode %s", rs.Generation, rs.Mode())
	}
	if err := os.WriteFile(file, []byte(`"no-network"`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if rs := h.srv.Current(); rs.Generation != 2 || rs.Mode() != policy.ModeNoNetwork {
		t.Fatalf("after reload: generation %d mode %s", rs.Generation, rs.Mode())
	}
	if !strings.Contains(h.logs.String(), `"msg":"policy rejected; the previous policy stays in force","source":"sighup"`) {
		t.Fatalf("rejected reload not logged")
	}
}

// TestReloadWithoutPolicyFileSaysSo: SIGHUP with no --policy changes nothing and says
// why, where a silent one leaves an operator who expected a reload guessing.
func TestReloadWithoutPolicyFileSaysSo(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	before := h.srv.Current()
	if err := h.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if h.srv.Current() != before {
		t.Fatal("a reload without a file changed the rule set")
	}
	if !strings.Contains(h.logs.String(), `"msg":"SIGHUP: no --policy file to re-read; the running policy stays"`) {
		t.Fatalf("no line says why nothing was reloaded: %s", h.logs.String())
	}
}

func TestStartupWithBrokenPolicyFileFails(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`{"network_mode":"allowlist"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{PolicyFile: file}); err == nil || !strings.Contains(err.Error(), "allowed_hosts") {
		t.Fatalf("err %v", err)
	}
}

func TestReadinessNeedsForwardingOff(t *testing.T) {
	cases := []struct {
		ipv4, ipv6 string // "" = file absent
		ready      bool
	}{
		{"0\n", "0\n", true},
		{"0\n", "", true},
		{"1\n", "0\n", false},
		{"0\n", "1\n", false},
		{"", "0\n", false},
		{"\n", "0\n", false}, // no value is not 0
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q/%q", tc.ipv4, tc.ipv6), func(t *testing.T) {
			proc := t.TempDir()
			for path, v := range map[string]string{"sys/net/ipv4/ip_forward": tc.ipv4, "sys/net/ipv6/conf/all/forwarding": tc.ipv6} {
				if v == "" {
					continue
				}
				if err := os.MkdirAll(filepath.Join(proc, filepath.Dir(path)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(proc, path), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			h := newHarness(t, func(c *Config) { c.RequireNoForwarding, c.ProcRoot = true, proc })
			code, _ := h.admin("GET", "/readyz", "")
			if ready := code == 200; ready != tc.ready {
				t.Fatalf("readyz %d, want ready=%v", code, tc.ready)
			}
			if err := adminapi.NewClient(h.socket, nil).Ready(t.Context()); (err == nil) != tc.ready {
				t.Fatalf("healthcheck %v, want ready=%v", err, tc.ready)
			}
			// Start says so at once, not only to whoever asks /readyz.
			if said := strings.Contains(h.logs.String(), "not ready: this sidecar would route packets"); said == tc.ready {
				t.Fatalf("start-up logged not ready: %v, want %v:\n%s", said, !tc.ready, h.logs.String())
			}
		})
	}
}

// A policy nested a million levels deep (a 2 MiB body) is refused like any broken one,
// by the admin API and by SIGHUP's reload, and the running policy stays.
func TestDeeplyNestedPolicyIsRefused(t *testing.T) {
	deep := strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20)
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`"no-network"`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.PolicyFile = file })
	if code, got := h.admin("PUT", "/v1/policy", deep); code != 400 || !strings.Contains(fmt.Sprint(got["errors"]), "nesting deeper than") {
		t.Fatalf("PUT: %d %v", code, got)
	}
	if err := os.WriteFile(file, []byte(deep), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(); err == nil {
		t.Fatal("the deep file reloaded")
	}
	if rs := h.srv.Current(); rs.Generation != 1 || rs.Mode() != policy.ModeNoNetwork {
		t.Fatalf("generation %d mode %s", rs.Generation, rs.Mode())
	}
}

// An envelope's unknown keys are reported briefly, however many and long they are.
func TestEnvelopeErrorsAreBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"policy":"public","` + strings.Repeat("k", 1<<20) + `":1`)
	for i := range 1000 {
		fmt.Fprintf(&b, `,"x%d":1`, i)
	}
	b.WriteString("}")
	_, _, _, err := parsePolicyBody([]byte(b.String()))
	fes := policy.FieldErrors(err)
	if len(fes) != maxEnvelopeKeyErrors+1 || !strings.Contains(fes[len(fes)-1].Error(), "and 991 more unknown keys") {
		t.Fatalf("%d errors, last %v", len(fes), fes[len(fes)-1])
	}
	if n := len(err.Error()); n > 4096 {
		t.Fatalf("error message of %d bytes", n)
	}
	// Up to the bound every key is named and nothing is summed up; one more is summed.
	for _, unknown := range []int{maxEnvelopeKeyErrors, maxEnvelopeKeyErrors + 1} {
		var b strings.Builder
		b.WriteString(`{"policy":"public"`)
		for i := range unknown {
			fmt.Fprintf(&b, `,"x%02d":1`, i)
		}
		b.WriteString("}")
		_, _, _, err := parsePolicyBody([]byte(b.String()))
		fes := policy.FieldErrors(err)
		want := min(unknown, maxEnvelopeKeyErrors)
		if unknown > maxEnvelopeKeyErrors {
			want++
		}
		if len(fes) != want || strings.Contains(err.Error(), "and 0 more") {
			t.Errorf("%d unknown keys: %d errors, want %d: %v", unknown, len(fes), want, err)
		}
	}
}

// Task and phase labels, logged with every decision, are short lines of text.
func TestEnvelopeLabelsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		label string
		ok    bool
	}{
		{"run", true},
		{"évaluation-2", true},
		{strings.Repeat("a", adminapi.MaxLabelBytes), true},
		{strings.Repeat("a", adminapi.MaxLabelBytes+1), false},
		{"run\nfake line", false},
		{"\x1b[31mred", false}, // a control character first
		{"run\u2028", true},    // not a control character; JSON logs escape it
	} {
		body, _ := json.Marshal(map[string]any{"policy": "public", "phase": tc.label})
		_, _, phase, err := parsePolicyBody(body)
		if ok := err == nil; ok != tc.ok || ok && *phase != tc.label {
			t.Errorf("phase %q: %v", tc.label, err)
		}
	}
}

// GET /v1/policy after an envelope PUT reports every field, exactly: the digest is the
// SHA-256 of the canonical form it reports beside it (the text, computed here rather
// than with Policy.Digest, so a digest that stops following the policy fails).
func TestAdminPolicyStatus(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Task, c.Phase = "t0", "baseline" })
	cases := []struct {
		body      string
		canonical string // the canonical wire form GET reports as "policy"
		mode      string
		task      string
		phase     string
	}{
		{`{"policy":{"network_mode":"allowlist","allowed_hosts":["A.test.","a.test","b.test"]},"task":"t1","phase":"agent"}`,
			`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test"]}`, "allowlist", "t1", "agent"},
		{`{"policy":{"network_mode":"allowlist","allowed_hosts":["a.test"]},"task":"t1","phase":"agent"}`,
			`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "allowlist", "t1", "agent"},
		{`{"policy":{"network_mode":"denylist","denied_hosts":["a.test"]},"task":"t2","phase":"evaluation"}`,
			`{"network_mode":"denylist","denied_hosts":["a.test"]}`, "denylist", "t2", "evaluation"},
		// Absent labels keep the current ones.
		{`{"policy":"public"}`, `"public"`, "public", "t2", "evaluation"},
	}
	for i, tc := range cases {
		if code, got := h.admin("PUT", "/v1/policy", tc.body); code != 200 {
			t.Fatalf("PUT %s: %d %v", tc.body, code, got)
		}
		var st struct {
			Generation *uint64         `json:"generation"`
			Digest     *string         `json:"digest"`
			Mode       *string         `json:"mode"`
			Policy     json.RawMessage `json:"policy"`
			Task       *string         `json:"task"`
			Phase      *string         `json:"phase"`
		}
		raw := adminRaw(t, h.socket, "/v1/policy")
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatalf("GET /v1/policy: %v: %s", err, raw)
		}
		var keys map[string]json.RawMessage
		_ = json.Unmarshal(raw, &keys)
		if len(keys) != 6 || st.Generation == nil || st.Digest == nil || st.Mode == nil || st.Policy == nil || st.Task == nil || st.Phase == nil {
			t.Fatalf("GET /v1/policy: want exactly generation, digest, mode, policy, task, phase: %s", raw)
		}
		sum := sha256.Sum256([]byte(tc.canonical))
		want := "sha256:" + hex.EncodeToString(sum[:])
		if *st.Generation != uint64(i+2) || *st.Mode != tc.mode || string(st.Policy) != tc.canonical ||
			*st.Task != tc.task || *st.Phase != tc.phase {
			t.Errorf("after PUT %s: GET /v1/policy %s, want generation %d, mode %s, policy %s, task %s, phase %s",
				tc.body, raw, i+2, tc.mode, tc.canonical, tc.task, tc.phase)
		}
		if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(*st.Digest) || *st.Digest != want {
			t.Errorf("after PUT %s: digest %s, want %s (SHA-256 of %s)", tc.body, *st.Digest, want, tc.canonical)
		}
	}
}

// adminRaw is the body of a GET on the admin socket.
func adminRaw(t *testing.T, socket, path string) []byte {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := client.Get("http://admin" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v: %s", path, resp.StatusCode, err, body)
	}
	return body
}

// Every admin answer, success or refusal, is JSON and says so.
func TestAdminAnswersAreJSON(t *testing.T) {
	h := newHarness(t)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", h.socket)
		},
	}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/v1/policy", "", 200},
		{"GET", "/v1/blocked", "", 200},
		{"PUT", "/v1/policy", `"public"`, 200},
		{"PUT", "/v1/policy", `nope`, 400},
	} {
		req, err := http.NewRequest(tc.method, "http://admin"+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if resp.StatusCode != tc.want || resp.Header.Get("Content-Type") != "application/json" || err != nil {
			t.Errorf("%s %s: %d %q %v, want %d application/json", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), err, tc.want)
		}
	}
}
