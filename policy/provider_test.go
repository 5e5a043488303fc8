package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func planTestHosts(prefix string, n int) string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf(`"%s%d"`, prefix, i)
	}
	return strings.Join(hosts, ",")
}

func planTestCIDRs(n int) string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf(`"198.51.100.%d"`, i)
	}
	return strings.Join(hosts, ",")
}

// docs/policy.md §8: what each provider accepts, and the error naming provider, phase, entry and
// rule for what it does not.
func TestProviderChecks(t *testing.T) {
	allow := func(hosts string) string { return `{"network_mode":"allowlist","allowed_hosts":[` + hosts + `]}` }
	deny := `{"network_mode":"denylist","denied_hosts":["exfil.test"]}`
	tests := []struct {
		provider string
		phase    Phase
		policy   string
		wantErr  string // "" accepted; otherwise the whole error text
	}{
		{"host_process", PhaseRun, `"public"`, ""},
		{"host_process", PhaseRun, `"no-network"`, `run_network_policy "no-network": provider host_process, run phase: cannot enforce no-network (it supports public); host_process provides no network isolation`},
		{"host_process", PhaseBaseline, allow(`"model.test"`), `baseline_network_policy "allowlist": provider host_process, baseline phase: cannot enforce allowlist (it supports public); host_process provides no network isolation`},
		{"host_process", PhaseEvaluation, deny, `evaluation_network_policy "denylist": provider host_process, evaluation phase: cannot enforce denylist (it supports public); host_process provides no network isolation`},

		{"docker", PhaseRun, `"public"`, ""},
		{"docker", PhaseRun, `"no-network"`, ""},
		{"docker", PhaseRun, allow(`"model.test:443","*.pkg.test","[2001:db8::1]:443","203.0.113.0/24"`), ""},
		{"docker", PhaseRun, deny, ""},

		{"daytona", PhaseRun, `"public"`, ""},
		{"daytona", PhaseRun, `"no-network"`, ""},
		{"daytona", PhaseRun, allow(`"model.test","*.pkg.test"`), ""},
		{"daytona", PhaseRun, allow(`"198.51.100.7","203.0.113.0/24"`), ""},
		{"daytona", PhaseRun, allow(``), ""},
		{"daytona", PhaseEvaluation, deny, `evaluation_network_policy "denylist": provider daytona, evaluation phase: cannot enforce denylist (it supports public, no-network, allowlist); only docker enforces a denylist, and it is never broadened to public`},
		{"daytona", PhaseRun, allow(`"model.test:443"`), `run_network_policy.allowed_hosts[0] "model.test:443": provider daytona, run phase: port-specific targets cannot be enforced; write the host without a port`},
		{"daytona", PhaseRun, allow(`"model.test:1"`), `run_network_policy.allowed_hosts[0] "model.test:1": provider daytona, run phase: port-specific targets cannot be enforced; write the host without a port`},
		{"daytona", PhaseRun, allow(`"2001:db8::1"`), `run_network_policy.allowed_hosts[0] "2001:db8::1": provider daytona, run phase: IPv6 entries are not supported`},
		{"daytona", PhaseRun, allow(`"198.51.100.7","2001:db8::/32"`), `run_network_policy.allowed_hosts[1] "2001:db8::/32": provider daytona, run phase: IPv6 entries are not supported`},
		{"daytona", PhaseRun, allow(`"model.test","198.51.100.7"`), `run_network_policy.allowed_hosts[1] "198.51.100.7": provider daytona, run phase: domain entries and IPv4 network entries cannot be mixed in one list (the list starts with a domain entry, model.test)`},
		{"daytona", PhaseBaseline, allow(`"203.0.113.0/24","*.pkg.test"`), `baseline_network_policy.allowed_hosts[1] "*.pkg.test": provider daytona, baseline phase: domain entries and IPv4 network entries cannot be mixed in one list (the list starts with an IPv4 network entry, 203.0.113.0/24)`},
		{"daytona", PhaseRun, allow(`"2001:db8::1","model.test","198.51.100.7"`), `run_network_policy.allowed_hosts[0] "2001:db8::1": provider daytona, run phase: IPv6 entries are not supported` + "\n" +
			`run_network_policy.allowed_hosts[2] "198.51.100.7": provider daytona, run phase: domain entries and IPv4 network entries cannot be mixed in one list (the list starts with a domain entry, model.test)`},
		// Errors come in the order of the entries, whichever rule each breaks.
		{"daytona", PhaseRun, allow(`"model.test","198.51.100.7","pkg.test:443"`), `run_network_policy.allowed_hosts[1] "198.51.100.7": provider daytona, run phase: domain entries and IPv4 network entries cannot be mixed in one list (the list starts with a domain entry, model.test)` + "\n" +
			`run_network_policy.allowed_hosts[2] "pkg.test:443": provider daytona, run phase: port-specific targets cannot be enforced; write the host without a port`},
		{"daytona", PhaseRun, allow(planTestHosts("h", 20)), ""},
		{"daytona", PhaseRun, allow(planTestHosts("h", 21)), `run_network_policy.allowed_hosts[20] "h20": provider daytona, run phase: at most 20 domain entries are supported`},
		{"daytona", PhaseRun, allow(planTestCIDRs(10)), ""},
		{"daytona", PhaseRun, allow(planTestCIDRs(11)), `run_network_policy.allowed_hosts[10] "198.51.100.10": provider daytona, run phase: at most 10 IPv4 network entries are supported`},

		{"modal", PhaseRun, `"public"`, ""},
		{"modal", PhaseRun, `"no-network"`, ""},
		{"modal", PhaseRun, allow(`"model.test","198.51.100.7","2001:db8::1","203.0.113.0/24"`), ""},
		{"modal", PhaseRun, deny, `run_network_policy "denylist": provider modal, run phase: cannot enforce denylist (it supports public, no-network, allowlist); only docker enforces a denylist, and it is never broadened to public`},
		{"modal", PhaseRun, allow(`"[2001:db8::1]:443"`), `run_network_policy.allowed_hosts[0] "[2001:db8::1]:443": provider modal, run phase: port-specific targets cannot be enforced; write the host without a port`},
		{"modal", PhaseRun, allow(`"*.pkg.test","model.test:443"`), `run_network_policy.allowed_hosts[0] "*.pkg.test": provider modal, run phase: wildcard host names are not supported; list each host name` + "\n" +
			`run_network_policy.allowed_hosts[1] "model.test:443": provider modal, run phase: port-specific targets cannot be enforced; write the host without a port`},
		{"modal", PhaseEvaluationBaseline, allow(`"*.pkg.test"`), `evaluation_baseline_network_policy.allowed_hosts[0] "*.pkg.test": provider modal, evaluation_baseline phase: wildcard host names are not supported; list each host name`},
	}
	for _, tt := range tests {
		t.Run(tt.provider+" "+string(tt.phase)+" "+tt.policy, func(t *testing.T) {
			c, ok := LookupProvider(tt.provider)
			if !ok {
				t.Fatalf("unknown provider %s", tt.provider)
			}
			err := c.Check(tt.phase, planTestPolicy(t, tt.policy)).err()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("Check =\n%s\nwant\n%s", got, tt.wantErr)
			}
		})
	}
}

// The provider check runs on the effective policy at planning, before any environment
// opens: a plan is refused as a whole.
func TestPlanRefusesWhatTheProviderCannotEnforce(t *testing.T) {
	pl := Planner{}
	_, err := pl.Plan(planTestTask(t, `{"task_id":"t","provider":"daytona","evaluation_mode":"fresh","evaluation_network_policy":{"network_mode":"denylist","denied_hosts":["exfil.test"]},"evaluation_baseline_network_policy":{"network_mode":"allowlist","allowed_hosts":["2001:db8::1"]}}`))
	want := `task "t": evaluation_network_policy "denylist": provider daytona, evaluation phase: cannot enforce denylist (it supports public, no-network, allowlist); only docker enforces a denylist, and it is never broadened to public` + "\n" +
		`task "t": evaluation_baseline_network_policy.allowed_hosts[0] "2001:db8::1": provider daytona, evaluation_baseline phase: IPv6 entries are not supported`
	if err == nil || err.Error() != want {
		t.Errorf("Plan error =\n%v\nwant\n%s", err, want)
	}
}

func TestNativeOptions(t *testing.T) {
	tests := []struct {
		provider, policy, want string
	}{
		{"daytona", `"public"`, `{"networkBlockAll":false}`},
		{"daytona", `"no-network"`, `{"networkBlockAll":true}`},
		{"daytona", `{"network_mode":"allowlist","allowed_hosts":[]}`, `{"networkBlockAll":true}`},
		{"daytona", `{"network_mode":"allowlist","allowed_hosts":["Model.Test.","*.pkg.test"]}`, `{"domainAllowList":["model.test","*.pkg.test"],"networkAllowList":[],"networkBlockAll":false}`},
		{"daytona", `{"network_mode":"allowlist","allowed_hosts":["198.51.100.7","203.0.113.0/24"]}`, `{"domainAllowList":[],"networkAllowList":["198.51.100.7/32","203.0.113.0/24"],"networkBlockAll":false}`},
		{"modal", `"public"`, `{"block_network":false}`},
		{"modal", `"no-network"`, `{"block_network":true}`},
		{"modal", `{"network_mode":"allowlist","allowed_hosts":[]}`, `{"block_network":true}`},
		{"modal", `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"block_network":false,"outbound_cidr_allowlist":[],"outbound_domain_allowlist":["model.test"]}`},
		{"modal", `{"network_mode":"allowlist","allowed_hosts":["model.test","198.51.100.7","2001:db8::1","203.0.113.0/24"]}`, `{"block_network":false,"outbound_cidr_allowlist":["198.51.100.7/32","2001:db8::1/128","203.0.113.0/24"],"outbound_domain_allowlist":["model.test"]}`},
		{"docker", `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `null`},
		{"host_process", `"public"`, `null`},
	}
	for _, tt := range tests {
		c, _ := LookupProvider(tt.provider)
		got, err := json.Marshal(c.Native(planTestPolicy(t, tt.policy)))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.want {
			t.Errorf("%s.Native(%s) = %s, want %s", tt.provider, tt.policy, got, tt.want)
		}
	}
}

func TestDockerNetworkMode(t *testing.T) {
	restricted := `{"task_id":"t","baseline_network_policy":"public","run_network_policy":"no-network"}`
	allPublic := `{"task_id":"t"}`
	allNone := `{"task_id":"t","baseline_network_policy":"no-network","run_network_policy":"no-network","evaluation_network_policy":"no-network"}`
	tests := []struct {
		network, task, wantErr string
	}{
		{"", restricted, ""},
		{"bridge", restricted, ""},
		{"my-bridge", restricted, ""},
		{"host", restricted, `task "t": network "host": provider docker, run phase: network host shares a network namespace the egress control cannot rewire, so dynamic policies are rejected; run_network_policy is no-network (use a bridge network, or public in every phase)`},
		{"container:abc123", restricted, `task "t": network "container:abc123": provider docker, run phase: network container:abc123 shares a network namespace the egress control cannot rewire, so dynamic policies are rejected; run_network_policy is no-network (use a bridge network, or public in every phase)`},
		{"none", restricted, `task "t": network "none": provider docker, baseline phase: network none has no interface the egress sidecar could serve, so dynamic policies are rejected; baseline_network_policy is public (use a bridge network, or no-network in every phase)`},
		{"host", allPublic, ""},
		{"none", allNone, ""},
		{"none", allPublic, "provider docker, baseline phase: network none"},
	}
	for _, tt := range tests {
		pl := Planner{Override: EnvParams{Network: tt.network}}
		_, err := pl.Plan(planTestTask(t, tt.task))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if tt.wantErr == "" && got != "" || tt.wantErr != "" && !strings.Contains(got, tt.wantErr) {
			t.Errorf("network %q, task %s: error\n%s\nwant\n%s", tt.network, tt.task, got, tt.wantErr)
		}
	}
}

func TestDockerOptionsRefusedForOtherProviders(t *testing.T) {
	pl := Planner{Override: planTestEnv(t, `{"network":"bridge","allowlist_proxy_start_timeout":5}`), Provider: ProviderModal}
	_, err := pl.Plan(planTestTask(t, `{"task_id":"t"}`))
	want := `task "t": network "bridge": is a docker option; provider modal does not take it` + "\n" +
		`task "t": allowlist_proxy_start_timeout 5: is a docker option; provider modal does not take it`
	if err == nil || err.Error() != want {
		t.Errorf("error =\n%v\nwant\n%s", err, want)
	}
}

func TestCapabilityMatrix(t *testing.T) {
	want := map[string]string{
		"host_process": "public",
		"docker":       "public,no-network,allowlist,denylist",
		"daytona":      "public,no-network,allowlist",
		"modal":        "public,no-network,allowlist",
	}
	if got := strings.Join(ProviderNames(), ","); got != "host_process,docker,daytona,modal" {
		t.Errorf("providers %s", got)
	}
	for _, c := range Capabilities {
		modes := make([]string, len(c.Modes))
		for i, m := range c.Modes {
			modes[i] = string(m)
		}
		if got := strings.Join(modes, ","); got != want[c.Name] {
			t.Errorf("%s modes %s, want %s", c.Name, got, want[c.Name])
		}
		if c.DynamicSwitch != (c.Name != ProviderHostProcess) {
			t.Errorf("%s dynamic switch %v", c.Name, c.DynamicSwitch)
		}
	}
}
