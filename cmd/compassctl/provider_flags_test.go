package main

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy"
)

// TestProviderFlagsReadTheEnvironment: the provider settings `env` and `run` share take
// their defaults from the documented variables (docs/docker.md, docs/run.md); without
// them, from the provider's defaults. COMPASS_DNS_UPSTREAM is a comma-separated list.
func TestProviderFlagsReadTheEnvironment(t *testing.T) {
	flagsOf := func(t *testing.T, path ...string) *pflag.FlagSet {
		t.Helper()
		cmd, _, err := newRootCommand().Find(path)
		if err != nil {
			t.Fatal(err)
		}
		if path[0] == "env" {
			return cmd.PersistentFlags()
		}
		return cmd.Flags()
	}
	vars := map[string]string{
		"COMPASS_STATE_DIR":      "/srv/compass",
		"COMPASS_EGRESS_NETWORK": "my-egress",
		"COMPASS_POOL":           "10.99.0.0/16",
		"COMPASS_PROXY_IMAGE":    "proxy:test",
		"COMPASS_PROBE_IMAGE":    "probe:test",
		"COMPASS_OWNER":          "ci",
		"COMPASS_DNS_UPSTREAM":   " 10.0.0.53 , ,10.0.0.54:5353",
	}
	tests := []struct {
		flag, set, unset string
	}{
		{"state-dir", "/srv/compass", docker.DefaultStateDir},
		{"egress-network", "my-egress", docker.DefaultEgressNetwork},
		{"pool", "10.99.0.0/16", docker.DefaultPool.String()},
		{"proxy-image", "proxy:test", docker.DefaultProxyImage},
		{"probe-image", "probe:test", docker.DefaultProbeImage},
		{"owner", "ci", docker.DefaultOwner},
		{"dns-upstream", "[10.0.0.53,10.0.0.54:5353]", "[]"},
	}
	for _, path := range [][]string{{"env"}, {"run"}} {
		for _, withVars := range []bool{true, false} {
			for k, v := range vars {
				if !withVars {
					v = "" // empty reads as unset
				}
				t.Setenv(k, v)
			}
			fs := flagsOf(t, path...)
			for _, tc := range tests {
				f := fs.Lookup(tc.flag)
				if f == nil {
					if path[0] == "run" && tc.flag == "probe-image" {
						continue // run never verifies
					}
					t.Fatalf("%s has no --%s", path[0], tc.flag)
				}
				want := tc.unset
				if withVars {
					want = tc.set
				}
				if got := f.Value.String(); got != want {
					t.Errorf("%s --%s (variables set: %t) = %q, want %q", path[0], tc.flag, withVars, got, want)
				}
			}
		}
	}
}

// TestDocumentedDefaults: the defaults the docs promise (docs/docker.md, docs/run.md).
func TestDocumentedDefaults(t *testing.T) {
	tests := []struct {
		path       []string
		flag, want string
	}{
		{[]string{"env", "open"}, "proxy-start-timeout", "30s"},
		{[]string{"env", "attach"}, "proxy-start-timeout", "30s"},
		{[]string{"env", "open"}, "role", "agent"},
		{[]string{"env", "verify"}, "outside-port", "80"},
		{[]string{"run"}, "concurrency", "1"},
		{[]string{"run"}, "out", "out"},
		{[]string{"run"}, "progress", "auto"},
		{[]string{"run"}, "resume", "false"},
		{[]string{"run"}, "subnet-bits", "28"},
		{[]string{"env"}, "subnet-bits", "28"},
	}
	for _, tc := range tests {
		cmd, _, err := newRootCommand().Find(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags().Lookup(tc.flag)
		if f == nil {
			f = cmd.PersistentFlags().Lookup(tc.flag)
		}
		if f == nil || f.DefValue != tc.want {
			t.Errorf("%v --%s: default %v, want %q", tc.path, tc.flag, f, tc.want)
		}
	}
}

// TestProviderConfigOfFlags: every provider setting given on the command line reaches
// the provider, for `env` and for `run`; a dropped --proxy-arg or --owner would start
// sidecars without it or act on another owner's environments.
func TestProviderConfigOfFlags(t *testing.T) {
	noEngine(t)
	f := envFlags{
		stateDir: "/srv/s", egress: "eg", pool: "10.98.0.0/16", proxyImage: "p:1", probeImage: "q:1",
		owner: "o1", subnetBits: 26, dnsUpstreams: []string{"10.0.0.53"}, proxyArgs: []string{"--deny-private"},
	}
	check := func(name string, got docker.Config, probe bool) {
		t.Helper()
		if got.StateDir != f.stateDir || got.EgressNetwork != f.egress || got.Pool != netip.MustParsePrefix(f.pool) ||
			got.ProxyImage != f.proxyImage || got.Owner != f.owner || got.SubnetBits != f.subnetBits ||
			!slices.Equal(got.DNSUpstreams, f.dnsUpstreams) || !slices.Equal(got.ExtraProxyArg, f.proxyArgs) ||
			(probe && got.ProbeImage != f.probeImage) {
			t.Errorf("%s: provider config %+v does not carry the flags %+v", name, got, f)
		}
	}
	p, done, err := f.provider()
	if err != nil {
		t.Fatal(err)
	}
	check("env", p.Config(), true)
	done()
	rp, done, err := newRunProvider(&f)
	if err != nil {
		t.Fatal(err)
	}
	check("run", rp.Config(), false)
	done()
}

func TestEnvPrint(t *testing.T) {
	for _, tc := range []struct {
		json bool
		want string
	}{
		{true, "{\n  \"env\": \"t1\"\n}\n"},
		{false, "t1 text\n"},
	} {
		var buf bytes.Buffer
		f := envFlags{json: tc.json}
		err := f.print(&buf, map[string]string{"env": "t1"}, func(w io.Writer) { io.WriteString(w, "t1 text\n") })
		if err != nil || buf.String() != tc.want {
			t.Errorf("json %t: printed %q, %v; want %q", tc.json, buf.String(), err, tc.want)
		}
	}
}

func TestCheckProxyStartTimeout(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{time.Nanosecond, ""},
		{time.Hour, ""},
		{time.Hour + time.Nanosecond, "--proxy-start-timeout 1h0m0.000000001s: must be at most 1h0m0s"},
		{0, "--proxy-start-timeout 0s: must be positive"},
	} {
		err := checkProxyStartTimeout(tc.d)
		if got := errString(err); got != tc.want {
			t.Errorf("checkProxyStartTimeout(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPolicySourceResolve: --policy, or --plan with --phase (default: the command's
// phase), each refusal a usage error naming the flags; a --phase that picks nothing is
// refused, not dropped (open and attach would start under --policy in silence).
func TestPolicySourceResolve(t *testing.T) {
	plan := writeTemp(t, "plan.json", `{"baseline_network_policy": "public", "run_network_policy": "no-network"}`)
	tests := []struct {
		name                string
		flags               []string
		wantPolicy, wantErr string
		wantPhase           string
	}{
		{"policy", []string{"--policy", `"no-network"`}, `"no-network"`, "", "baseline"},
		{"plan, default phase", []string{"--plan", plan}, `"public"`, "", "baseline"},
		{"plan and phase", []string{"--plan", plan, "--phase", "run"}, `"no-network"`, "", "run"},
		{"neither", nil, "", "", ""},
		{"both", []string{"--policy", `"public"`, "--plan", plan}, "", "give --policy or --plan, not both", ""},
		{"phase with policy", []string{"--policy", `"public"`, "--phase", "run"}, "", `--phase "run" picks a phase of --plan; with --policy, --phase is not used`, ""},
		{"phase alone", []string{"--phase", "run"}, "", `--phase "run" needs --plan FILE to take the policy from`, ""},
		{"bad policy", []string{"--policy", `"sometimes"`}, "", `--policy: `, ""},
		{"no plan file", []string{"--plan", "/nonexistent/plan.json"}, "", `--plan: open /nonexistent/plan.json: no such file or directory`, ""},
		{"no such phase", []string{"--plan", plan, "--phase", "evaluation"}, "", `no policy for phase "evaluation"`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var src policySource
			cmd := &cobra.Command{}
			src.bind(cmd, "")
			if err := cmd.ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			p, phase, err := src.resolve("t1", "baseline")
			if tc.wantErr != "" {
				var ue usageError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &ue) {
					t.Errorf("error %v, want a usage error saying %q", err, tc.wantErr)
				}
				return
			}
			got := ""
			if p.Mode.Valid() {
				got = p.String()
			}
			if err != nil || got != tc.wantPolicy || phase != tc.wantPhase {
				t.Errorf("resolve = %s, %q, %v; want %s, %q", got, phase, err, tc.wantPolicy, tc.wantPhase)
			}
		})
	}
	// Neither flag: an environment opens under the runtime default.
	var src policySource
	src.bind(&cobra.Command{}, "")
	if p, err := src.baseline("t1", "agent"); err != nil || p.String() != `"public"` {
		t.Errorf("baseline without --policy or --plan = %s, %v; want \"public\"", p, err)
	}
}

// TestBesideSelf: image build takes the static binaries from next to compassctl unless
// told otherwise.
func TestBesideSelf(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got := besideSelf("/opt/proxy", "compass-proxy"); got != "/opt/proxy" {
		t.Errorf("besideSelf with a path = %q, want the path", got)
	}
	if got, want := besideSelf("", "probe"), filepath.Join(filepath.Dir(self), "probe"); got != want {
		t.Errorf("besideSelf without a path = %q, want %q", got, want)
	}
}

// TestRecipeFileOrder: when two recipe files supply a field, the earlier --recipe wins
// (docs/policy.md §5).
func TestRecipeFileOrder(t *testing.T) {
	first := writeTemp(t, "first.json", `{"name": "first", "run_network_policy": "no-network"}`)
	second := writeTemp(t, "second.json", `{"name": "second", "run_network_policy": "public"}`)
	task := writeTemp(t, "task.yaml", "task_id: t1\nimage: i\nrun: [x]\n")
	for _, tc := range []struct {
		recipes []string
		want    string
	}{
		{[]string{first, second}, "recipe:first"},
		{[]string{second, first}, "recipe:second"},
	} {
		plans, err := buildPlans(planOptions{tasks: []string{task}, recipes: tc.recipes})
		if err != nil {
			t.Fatal(err)
		}
		if got := plans[0].Policies[policy.PhaseRun].Source; got != tc.want {
			t.Errorf("recipes %v: run policy from %q, want %q", tc.recipes, got, tc.want)
		}
		var table bytes.Buffer
		writePlanTables(&table, plans)
		if want := "applied recipes: " + strings.TrimPrefix(tc.want, "recipe:") + ", "; !strings.Contains(table.String(), want) {
			t.Errorf("recipes %v: the table does not list both recipes in order:\n%s", tc.recipes, table.String())
		}
	}
}
