package proxy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
)

// TestAdminClientAgreesWithServer drives every endpoint of a real sidecar's admin
// socket through adminapi.Client, the controller's and the healthcheck's client, and
// checks each decoded value: the two ends share their types, and this shows they also
// share the paths, the methods, the JSON and the error answers.
func TestAdminClientAgreesWithServer(t *testing.T) {
	proc := t.TempDir()
	forwarding := filepath.Join(proc, "sys/net/ipv4/ip_forward")
	if err := os.MkdirAll(filepath.Dir(forwarding), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(forwarding, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) {
		c.Task, c.Phase = "t0", "baseline"
		c.RequireNoForwarding, c.ProcRoot = true, proc
	})
	c := adminapi.NewClient(h.socket, nil)
	ctx := t.Context()

	if err := c.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	st, err := c.GetPolicy(ctx)
	wantStatus(t, "initial GetPolicy", st, err, 1, policy.NoNetwork, "t0", "baseline")

	// One refusal under generation 1, reported by GET /v1/blocked and then by the swap.
	if status, _ := h.connectStatus("a.test:443"); status != 403 {
		t.Fatalf("no-network CONNECT: %d", status)
	}
	blocked, err := c.Blocked(ctx)
	want := adminapi.BlockedSummary{Generation: 1, Total: 1, Top: []adminapi.BlockedTarget{
		{Host: "a.test", Port: 443, Type: typeConnect, Reason: "no-network", Count: 1}}}
	if err != nil || !reflect.DeepEqual(blocked, want) {
		t.Fatalf("Blocked: %+v %v, want %+v", blocked, err, want)
	}

	allowA := policy.Policy{Mode: policy.ModeAllowlist, Targets: []policy.Target{{Kind: policy.KindHost, Host: "a.test"}}}
	ack, err := c.PutPolicy(ctx, allowA, "t1", "run")
	wantStatus(t, "PutPolicy", ack.PolicyStatus, err, 2, allowA, "t1", "run")
	if ack.ClosedConnections != 0 || ack.PreviousBlocked == nil || !reflect.DeepEqual(*ack.PreviousBlocked, want) {
		t.Fatalf("PutPolicy: closed %d, previous_blocked %+v, want 0 and %+v", ack.ClosedConnections, ack.PreviousBlocked, want)
	}
	st, err = c.GetPolicy(ctx)
	wantStatus(t, "GetPolicy after PutPolicy", st, err, 2, allowA, "t1", "run")
	blocked, err = c.Blocked(ctx)
	if want := (adminapi.BlockedSummary{Generation: 2, Top: []adminapi.BlockedTarget{}}); err != nil || !reflect.DeepEqual(blocked, want) {
		t.Fatalf("Blocked of a fresh generation: %+v %v, want %+v", blocked, err, want)
	}

	// A swap that cuts a live tunnel says so.
	_, tunnel := h.connect(h.a.echoHostPort("a.test"), "")
	if tunnel == nil {
		t.Fatal("CONNECT a.test refused under an allowlist of a.test")
	}
	echoRoundTrip(t, tunnel, "before")
	ack, err = c.PutPolicy(ctx, policy.NoNetwork, "t1", "evaluation")
	wantStatus(t, "PutPolicy no-network", ack.PolicyStatus, err, 3, policy.NoNetwork, "t1", "evaluation")
	if ack.ClosedConnections != 1 || ack.PreviousBlocked == nil || ack.PreviousBlocked.Generation != 2 {
		t.Fatalf("PutPolicy no-network: closed %d, previous_blocked %+v, want 1 and generation 2", ack.ClosedConnections, ack.PreviousBlocked)
	}

	// A refused PUT: the error carries the status and every problem of the error body,
	// and the policy in force stays.
	_, err = c.PutPolicy(ctx, allowA, "t1", "bad\nphase")
	if err == nil || !strings.HasPrefix(err.Error(), "admin: PUT /v1/policy: 400 Bad Request: invalid policy; the running policy is unchanged: phase ") ||
		!strings.HasSuffix(err.Error(), adminapi.LabelRule) {
		t.Fatalf("PutPolicy with a bad label: %v", err)
	}
	st, err = c.GetPolicy(ctx)
	wantStatus(t, "GetPolicy after a refused PUT", st, err, 3, policy.NoNetwork, "t1", "evaluation")

	// The endpoints the client has no method for are where the package says.
	if got := string(adminRaw(t, h.socket, adminapi.PathLivez)); got != "ok\n" {
		t.Errorf("GET %s: %q", adminapi.PathLivez, got)
	}
	if got := string(adminRaw(t, h.socket, adminapi.PathMetrics)); !strings.Contains(got, "compass_proxy_policy_generation 3\n") {
		t.Errorf("GET %s does not report generation 3:\n%s", adminapi.PathMetrics, got)
	}

	// Not ready: the plain-text answer of /readyz is the error.
	if err := os.WriteFile(forwarding, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.Ready(ctx) != nil })
	if err := c.Ready(ctx); err == nil || !strings.HasPrefix(err.Error(), "admin: GET /readyz: 503 Service Unavailable: not ready: ") {
		t.Fatalf("Ready with forwarding on: %v", err)
	}
}

// wantStatus checks a decoded policy status against the policy that should be in force.
func wantStatus(t *testing.T, what string, st adminapi.PolicyStatus, err error, generation uint64, p policy.Policy, task, phase string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if st.Generation != generation || st.Digest != p.Digest() || st.Mode != p.Mode || !st.Policy.Equal(p) || st.Task != task || st.Phase != phase {
		t.Fatalf("%s: %+v, want generation %d, policy %s (%s), task %q, phase %q", what, st, generation, p, p.Digest(), task, phase)
	}
}
