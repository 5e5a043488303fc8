package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/compass-egress/compass-egress/net/addrguard"
)

// Planner resolves tasks into plans (docs/policy.md §6) and checks them against the
// provider (§8). Its zero value plans with no override, no recipe, and the defaults.
type Planner struct {
	// Override is the run-wide --env-params: the first source of every field.
	Override EnvParams
	// Recipes in command-line order: when two matching recipes supply the same field,
	// the earlier one is its source.
	Recipes []Recipe
	// Provider, when set (--provider), replaces the task's provider for every task, as
	// run-wide explicit settings take precedence over the TaskSpec.
	Provider string
	// EvaluationMode, when set (--evaluation-mode), replaces the task's mode likewise.
	EvaluationMode EvaluationMode
	// Check, when set, checks what else the caller needs of a plan (compassctl run: what
	// the runner and its provider require); its problems are reported with the plan's.
	// It sees the plan resolved as far as planning got, its policies perhaps not all.
	Check func(*Plan) []*FieldError
}

// Validate checks the planner's own inputs: a known provider and mode, and recipe names
// that are unique, since plans name recipes in sources and applied_recipes.
func (pl *Planner) Validate() error {
	var errs ErrorList
	if pl.Provider != "" {
		if _, ok := LookupProvider(pl.Provider); !ok {
			errs.add(&FieldError{Path: "provider", Value: Quote(pl.Provider), Rule: "unknown provider; use one of " + strings.Join(ProviderNames(), ", ")})
		}
	}
	if pl.EvaluationMode != "" && !pl.EvaluationMode.Valid() {
		// Named as its flag, like provider and recipe: compassctl reports these paths as
		// "--<path>", and a task file's evaluation_mode is checked elsewhere.
		errs.add(&FieldError{Path: "evaluation-mode", Value: Quote(string(pl.EvaluationMode)), Rule: "unknown evaluation mode; use shared or fresh"})
	}
	seen := map[string]string{}
	for _, r := range pl.Recipes {
		if first, dup := seen[r.Name]; dup {
			errs.add(&FieldError{Path: "recipe", Value: Quote(r.Name), Rule: fmt.Sprintf("is defined twice (%s and %s); recipe names must be unique", first, r.Origin)})
			continue
		}
		seen[r.Name] = r.Origin
	}
	return errs.err()
}

// PlanAll plans every task; it fails, reporting every task's problems, if any task
// cannot be planned. Like an ErrorList, the report stops after maxErrors problems: the
// tasks that fail after that are only counted.
func (pl *Planner) PlanAll(tasks []Task) ([]*Plan, error) {
	if err := pl.Validate(); err != nil {
		return nil, err
	}
	plans := make([]*Plan, 0, len(tasks))
	var errs []error
	shown, more := 0, 0 // problems reported, failing tasks left out
	for _, t := range tasks {
		p, err := pl.Plan(t)
		if err != nil {
			if shown >= maxErrors {
				more++
				continue
			}
			shown += len(FieldErrors(err))
			errs = append(errs, err)
			continue
		}
		plans = append(plans, p)
	}
	switch {
	case more == 1:
		errs = append(errs, errors.New("and 1 more task cannot be planned"))
	case more > 1:
		errs = append(errs, fmt.Errorf("and %d more tasks cannot be planned", more))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return plans, nil
}

// Plan resolves one task. Errors are a *TaskError listing every problem.
func (pl *Planner) Plan(t Task) (*Plan, error) {
	plan := &Plan{
		TaskID:            t.ID,
		Provider:          firstNonEmpty(pl.Provider, t.Provider, DefaultProvider),
		EvaluationMode:    EvaluationMode(firstNonEmpty(string(pl.EvaluationMode), string(t.EvaluationMode), string(EvaluationShared))),
		Policies:          map[Phase]ResolvedPolicy{},
		InjectNotice:      t.InjectNotice == nil || *t.InjectNotice,
		Network:           pl.Override.Network,
		ProxyStartTimeout: pl.Override.ProxyStartTimeout,
		Task:              t,
	}
	capability, known := LookupProvider(plan.Provider)
	if !known || !plan.EvaluationMode.Valid() {
		// Only a Task or Planner built in code, not one parsed, can get here.
		return nil, &TaskError{TaskID: t.ID, Errs: ErrorList{{Rule: fmt.Sprintf("cannot plan provider %s in evaluation mode %s", Quote(plan.Provider), Quote(string(plan.EvaluationMode)))}}}
	}
	errs := pl.checkOverride(plan)

	var matched []Recipe
	for _, r := range pl.Recipes {
		if r.Matches(t.ID, plan.Provider) {
			matched = append(matched, r)
			plan.AppliedRecipes = append(plan.AppliedRecipes, r.Name)
		}
	}
	if plan.AppliedRecipes == nil {
		plan.AppliedRecipes = []string{}
	}

	// The entries a recipe added follow the ones the policy was written with.
	type addition struct {
		recipe  string
		written int
	}
	added := map[Phase]addition{}
	for _, ph := range plan.Phases() {
		rp, supplier := pl.resolve(ph, t, matched, plan)
		if supplier != nil && rp.Policy.Mode == ModeAllowlist {
			written := len(rp.Policy.Targets)
			rp.Policy = inferEndpoints(rp.Policy, ph, supplier)
			added[ph] = addition{supplier.Name, written}
		}
		plan.Policies[ph] = rp
	}

	errs.add(checkRequiredEndpoints(plan, matched)...)
	for _, ph := range plan.Phases() {
		for _, e := range capability.Check(ph, plan.Policy(ph)) {
			if a, ok := added[ph]; ok && e.entry > a.written {
				e.Rule += fmt.Sprintf(" (recipe %s added this entry, an endpoint it requires; an entry of the policy's source, %s, that allows the endpoint makes the addition unneeded)",
					Quote(a.recipe), plan.Policies[ph].Source)
			}
			errs.add(e)
		}
	}
	if plan.Provider == ProviderDocker {
		errs.add(checkDockerNetwork(plan.Network, plan)...)
	}
	if pl.Check != nil {
		errs.add(pl.Check(plan)...)
	}
	if len(errs) > 0 {
		return nil, &TaskError{TaskID: t.ID, Errs: errs}
	}

	if capability.native != nil {
		plan.Native = map[Phase]NativeOptions{}
		for _, ph := range plan.Phases() {
			plan.Native[ph] = capability.Native(plan.Policy(ph))
		}
	}
	if plan.InjectNotice {
		plan.Notice = RestrictionNotice(plan.Policy(PhaseRun))
	}
	plan.Steps = Steps(plan)
	return plan, nil
}

// checkOverride refuses the run-wide settings the task's plan cannot take.
func (pl *Planner) checkOverride(plan *Plan) ErrorList {
	var errs ErrorList
	if p, set := pl.Override.Policies[PhaseEvaluationBaseline]; set && plan.EvaluationMode != EvaluationFresh {
		errs.add(&FieldError{Path: PhaseEvaluationBaseline.Field(), Value: Clip(p.String()), Rule: "an override of the evaluation baseline is only legal in fresh mode; this task is planned in shared mode, where the evaluation runs in the agent's environment under its baseline"})
	}
	if plan.Provider != ProviderDocker {
		if pl.Override.Network != "" {
			errs.add(&FieldError{Path: "network", Value: Quote(pl.Override.Network), Rule: fmt.Sprintf("is a docker option; provider %s does not take it", plan.Provider)})
		}
		if pl.Override.ProxyStartTimeout != 0 {
			errs.add(&FieldError{Path: "allowlist_proxy_start_timeout", Value: strconv.FormatFloat(pl.Override.ProxyStartTimeout.Seconds(), 'f', -1, 64), Rule: fmt.Sprintf("is a docker option; provider %s does not take it", plan.Provider)})
		}
	}
	return errs
}

// resolve picks one phase's policy: override > task > recipe > default, with the fresh
// evaluation baseline's own chain. It also returns the recipe that supplied the policy,
// if one did, since only that recipe may add inferred endpoints to it.
func (pl *Planner) resolve(ph Phase, t Task, matched []Recipe, plan *Plan) (ResolvedPolicy, *Recipe) {
	if p, ok := pl.Override.Policies[ph]; ok {
		return ResolvedPolicy{Policy: p, Source: SourceOverride}, nil
	}
	if ph == PhaseEvaluationBaseline {
		// The request-level common baseline also starts the fresh verifier.
		if p, ok := pl.Override.Policies[PhaseBaseline]; ok {
			return ResolvedPolicy{Policy: p, Source: SourceOverride}, nil
		}
	}
	if p, ok := t.Policies[ph]; ok {
		return ResolvedPolicy{Policy: p, Source: SourceTask}, nil
	}
	if ph == PhaseEvaluationBaseline && t.EvaluationEnvironment {
		// A declared verifier environment without a baseline of its own starts under its
		// own default, public, not under the agent's baseline.
		return ResolvedPolicy{Policy: Public, Source: SourceTask}, nil
	}
	for i := range matched {
		if p, ok := matched[i].Policies[ph]; ok {
			return ResolvedPolicy{Policy: p, Source: RecipeSource(matched[i].Name)}, &matched[i]
		}
	}
	if ph == PhaseEvaluationBaseline {
		// Inherit the agent baseline as resolved (inferred endpoints included), with its
		// source: whoever supplied the agent baseline supplied this one.
		inherited := plan.Policies[PhaseBaseline]
		for i := range matched {
			if RecipeSource(matched[i].Name) == inherited.Source {
				return inherited, &matched[i]
			}
		}
		return inherited, nil
	}
	return ResolvedPolicy{Policy: Public, Source: SourceDefault}, nil
}

// inferEndpoints adds the supplying recipe's required endpoints of this phase to the
// allowlist it supplied, unless a rule already allows them. A recipe never adds to a
// policy it did not supply.
func inferEndpoints(p Policy, ph Phase, r *Recipe) Policy {
	out := Policy{Mode: p.Mode, Targets: append([]Target{}, p.Targets...)}
	for _, e := range r.Required {
		if e.Phase != ph {
			continue
		}
		if !e.decide(Compile(out)).Allowed {
			out.Targets = append(out.Targets, e.Target)
		}
	}
	return out
}

// checkRequiredEndpoints fails the plan for every required endpoint of an applied recipe
// that the effective policy of its phase blocks. Endpoints of the evaluation baseline
// are not checked in shared mode, which has no evaluation environment.
func checkRequiredEndpoints(plan *Plan, matched []Recipe) ErrorList {
	var errs ErrorList
	for _, r := range matched {
		for _, e := range r.Required {
			rp, ok := plan.Policies[e.Phase]
			if !ok {
				continue
			}
			d := e.decide(Compile(rp.Policy))
			if d.Allowed {
				continue
			}
			errs.add(&FieldError{
				Path:  e.Phase.Field(),
				Value: fmt.Sprintf("%q", e.Target.String()),
				Rule: fmt.Sprintf("recipe %s requires this endpoint in the %s phase, but the effective %s policy %s (source: %s) blocks it (%s); recipes never broaden a policy: allow it in the policy's source",
					r.Name, e.Phase, e.Phase, Clip(rp.Policy.String()), rp.Source, blockedWhy(e, d)),
			})
		}
	}
	return errs
}

func blockedWhy(e Endpoint, d Decision) string {
	if d.Reason == ReasonInternalAddress {
		c, _ := addrguard.Classify(e.Target.Prefix.Addr())
		lift := fmt.Sprintf("an allowlist IP or CIDR rule within %s", c.Prefix)
		if !c.Liftable {
			lift = "no rule"
		}
		return fmt.Sprintf("%s: the sidecar refuses %s addresses unless %s allows them", d.Reason, c.Name, lift)
	}
	if d.Rule.Kind != 0 {
		return fmt.Sprintf("%s, rule %s", d.Reason, d.Rule)
	}
	return string(d.Reason)
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
