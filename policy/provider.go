package policy

import (
	"fmt"
	"strings"
)

// Provider names.
const (
	ProviderHostProcess = "host_process"
	ProviderDocker      = "docker"
	ProviderDaytona     = "daytona"
	ProviderModal       = "modal"
)

// DefaultProvider is the provider of a task that neither the task file nor --provider
// names: the one this project enforces itself.
const DefaultProvider = ProviderDocker

// Capability is one row of the provider matrix (docs/policy.md §8).
type Capability struct {
	Name string
	// Modes the provider can enforce. Anything else is refused at planning, never
	// broadened (a denylist does not become public).
	Modes []Mode
	// DynamicSwitch says whether the policy can change while an environment runs.
	DynamicSwitch bool
	// Limits describes the entry rules, for documentation.
	Limits string
	// check refuses what the provider cannot enforce of one phase's policy.
	check func(c Capability, ph Phase, p Policy) ErrorList
	// native generates the provider's request options; nil when it takes none.
	native func(p Policy) NativeOptions
}

// Capabilities is the provider matrix, in the order documents present it.
var Capabilities = []Capability{
	{
		Name:   ProviderHostProcess,
		Modes:  []Mode{ModePublic},
		Limits: "provides no isolation: any mode but public is rejected",
	},
	{
		Name:          ProviderDocker,
		Modes:         []Mode{ModePublic, ModeNoNetwork, ModeAllowlist, ModeDenylist},
		DynamicSwitch: true,
		Limits:        "dynamic policies need a bridge-style network (network none, host and container:<id> are rejected); allowlist and denylist through the egress proxy sidecar",
	},
	{
		Name:          ProviderDaytona,
		Modes:         []Mode{ModePublic, ModeNoNetwork, ModeAllowlist},
		DynamicSwitch: true,
		Limits:        "host names, leading-wildcard host names, IPv4 addresses and IPv4 CIDRs; domain and network entries not mixed in one list; at most 20 domain or 10 IPv4 network entries; no IPv6; no ports",
		check:         checkDaytona,
		native:        daytonaOptions,
	},
	{
		Name:          ProviderModal,
		Modes:         []Mode{ModePublic, ModeNoNetwork, ModeAllowlist},
		DynamicSwitch: true,
		Limits:        "host names, IPv4 and IPv6 addresses and CIDRs; no wildcards; no ports",
		check:         checkModal,
		native:        modalOptions,
	},
}

// LookupProvider returns a provider's row of the matrix.
func LookupProvider(name string) (Capability, bool) {
	for _, c := range Capabilities {
		if c.Name == name {
			return c, true
		}
	}
	return Capability{}, false
}

// ProviderNames lists the known providers.
func ProviderNames() []string {
	out := make([]string, len(Capabilities))
	for i, c := range Capabilities {
		out[i] = c.Name
	}
	return out
}

// Supports reports whether the provider can enforce the mode.
func (c Capability) Supports(m Mode) bool {
	for _, x := range c.Modes {
		if x == m {
			return true
		}
	}
	return false
}

// Check refuses, naming provider, phase, entry and rule, what the provider cannot
// enforce of the effective policy of one phase.
func (c Capability) Check(ph Phase, p Policy) ErrorList {
	if !c.Supports(p.Mode) {
		return ErrorList{c.refuse(ph, "", fmt.Sprintf("%q", p.Mode), unsupportedModeRule(c, p.Mode))}
	}
	if c.check == nil {
		return nil
	}
	return c.check(c, ph, p)
}

func unsupportedModeRule(c Capability, m Mode) string {
	modes := make([]string, len(c.Modes))
	for i, x := range c.Modes {
		modes[i] = string(x)
	}
	rule := fmt.Sprintf("cannot enforce %s (it supports %s)", m, strings.Join(modes, ", "))
	switch {
	case c.Name == ProviderHostProcess:
		rule += "; host_process provides no network isolation"
	case m == ModeDenylist:
		rule += "; only docker enforces a denylist, and it is never broadened to public"
	}
	return rule
}

// Native returns the provider's request options for one phase's policy, or nil.
func (c Capability) Native(p Policy) NativeOptions {
	if c.native == nil {
		return nil
	}
	return c.native(p)
}

// refuse builds the planning error for one phase: sub is the part of the policy at
// fault ("" for the whole policy, "allowed_hosts[2]" for an entry).
func (c Capability) refuse(ph Phase, sub, value, rule string) *FieldError {
	path := ph.Field()
	if sub != "" {
		path = joinPath(path, sub)
	}
	return &FieldError{
		Path:  path,
		Value: value,
		Rule:  fmt.Sprintf("provider %s, %s phase: %s", c.Name, ph, rule),
	}
}

// refuseEntry refuses the i-th entry of the policy's host list.
func (c Capability) refuseEntry(ph Phase, p Policy, i int, rule string) *FieldError {
	e := c.refuse(ph, fmt.Sprintf("%s[%d]", p.Mode.listKey(), i), fmt.Sprintf("%q", p.Targets[i].String()), rule)
	e.entry = i + 1
	return e
}

// refusePort refuses the i-th entry if it carries a port, for providers that enforce
// whole hosts only. The caller checks each entry's rules in turn, so that a list's
// errors come in the order of its entries.
func (c Capability) refusePort(ph Phase, p Policy, i int, errs *ErrorList) {
	if p.Targets[i].Port != 0 {
		errs.add(c.refuseEntry(ph, p, i, "port-specific targets cannot be enforced; write the host without a port"))
	}
}
