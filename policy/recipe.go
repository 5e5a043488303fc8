package policy

import (
	"fmt"
	"net/netip"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/compass-egress/compass-egress/net/addrguard"
)

// Recipe is a benchmark recipe: policies for the tasks it matches (the third source of
// docs/policy.md §6) and the endpoints those tasks need in each phase. A recipe never broadens a
// policy it did not supply.
type Recipe struct {
	Name string
	// TaskIDs are glob patterns (path.Match syntax) over task IDs; empty matches every task.
	TaskIDs []string
	// Providers are the providers the recipe is compatible with; empty matches every one.
	Providers []string
	// Policies holds the policy fields the recipe supplies.
	Policies PhasePolicies
	// Required are the endpoints a matched task needs, per phase.
	Required []Endpoint
	// Origin says where the recipe was read: "recipes/model.json" or "r.yaml[1]".
	Origin string
}

// Endpoint is one destination a phase must be able to reach: a host name or an IP
// address, always with a port.
type Endpoint struct {
	Target Target
	Phase  Phase
}

// Matches reports whether the recipe applies to a task on a provider.
func (r Recipe) Matches(taskID, provider string) bool {
	if len(r.Providers) > 0 && !contains(r.Providers, provider) {
		return false
	}
	if len(r.TaskIDs) == 0 {
		return true
	}
	for _, pat := range r.TaskIDs {
		if ok, _ := path.Match(pat, taskID); ok {
			return true
		}
	}
	return false
}

var (
	recipeKeys      = []string{"name", "match", "baseline_network_policy", "run_network_policy", "evaluation_network_policy", "evaluation_baseline_network_policy", "required_endpoints"}
	recipeMatchKeys = []string{"task_ids", "providers"}
	endpointKeys    = []string{"host", "port", "phase"}
	recipeName      = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
)

// LoadRecipes reads a recipe file (JSON or YAML) holding one recipe or a list.
func LoadRecipes(file string) ([]Recipe, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("policy: recipe file: %w", err)
	}
	v, err := DecodeDocument(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	rs, err := ParseRecipes(v, file)
	if err != nil {
		return nil, prefixLines(file+": ", err)
	}
	return rs, nil
}

// ParseRecipes validates a decoded recipe document: one recipe object or a list.
func ParseRecipes(v any, origin string) ([]Recipe, error) {
	var errs ErrorList
	var out []Recipe
	switch x := v.(type) {
	case map[string]any:
		r := parseRecipe(x, "", &errs)
		r.Origin = origin
		out = append(out, r)
	case []any:
		for i, item := range x {
			p := fmt.Sprintf("[%d]", i)
			obj, ok := item.(map[string]any)
			if !ok {
				errs.add(&FieldError{Path: p, Value: display(item), Rule: "a recipe is an object, not " + describe(item)})
				continue
			}
			r := parseRecipe(obj, p, &errs)
			r.Origin = origin + p
			out = append(out, r)
		}
	default:
		errs.add(&FieldError{Value: display(v), Rule: "a recipe file holds a recipe object or a list of them, not " + describe(v)})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

func parseRecipe(obj map[string]any, p string, errs *ErrorList) Recipe {
	at := func(k string) string { return joinPath(p, k) }
	checkKeys(obj, p, recipeKeys, "a recipe", errs)
	var r Recipe
	if raw, ok := obj["name"]; !ok {
		errs.add(&FieldError{Path: at("name"), Rule: "is required"})
	} else if s, isString := raw.(string); !isString || !recipeName.MatchString(s) {
		errs.add(&FieldError{Path: at("name"), Value: display(raw), Rule: "must be 1-64 characters of lower-case letters, digits, '.', '_' and '-'"})
	} else {
		r.Name = s
	}
	if raw, ok := obj["match"]; ok {
		parseRecipeMatch(raw, at("match"), &r, errs)
	}
	r.Policies = parsePhasePolicies(obj, p, errs)
	if raw, ok := obj["required_endpoints"]; ok {
		list, isList := raw.([]any)
		if !isList {
			errs.add(&FieldError{Path: at("required_endpoints"), Value: display(raw), Rule: "must be a list of endpoints, not " + describe(raw)})
		}
		for i, item := range list {
			if e, ok := parseEndpoint(item, fmt.Sprintf("%s[%d]", at("required_endpoints"), i), errs); ok {
				r.Required = append(r.Required, e)
			}
		}
	}
	return r
}

func parseRecipeMatch(raw any, p string, r *Recipe, errs *ErrorList) {
	obj, ok := raw.(map[string]any)
	if !ok {
		errs.add(&FieldError{Path: p, Value: display(raw), Rule: "must be an object with task_ids and/or providers, not " + describe(raw)})
		return
	}
	checkKeys(obj, p, recipeMatchKeys, "match", errs)
	r.TaskIDs = stringList(obj, "task_ids", p, errs, func(s string) string {
		if _, err := path.Match(s, ""); err != nil || s == "" {
			return "is not a valid glob pattern"
		}
		return ""
	})
	r.Providers = stringList(obj, "providers", p, errs, func(s string) string {
		if _, ok := LookupProvider(s); !ok {
			return "unknown provider; use one of " + strings.Join(ProviderNames(), ", ")
		}
		return ""
	})
}

// stringList reads obj[key] as a list of strings, each checked by bad (which returns
// the broken rule, or "").
func stringList(obj map[string]any, key, p string, errs *ErrorList, bad func(string) string) []string {
	raw, ok := obj[key]
	if !ok {
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		errs.add(&FieldError{Path: joinPath(p, key), Value: display(raw), Rule: "must be a list of strings, not " + describe(raw)})
		return nil
	}
	if len(list) == 0 {
		// An empty list reads as "matches nothing" to some and "no restriction" to others.
		errs.add(&FieldError{Path: joinPath(p, key), Rule: "is empty; omit it to match every value"})
		return nil
	}
	var out []string
	for i, item := range list {
		ip := fmt.Sprintf("%s[%d]", joinPath(p, key), i)
		s, ok := item.(string)
		if !ok {
			errs.add(&FieldError{Path: ip, Value: display(item), Rule: "must be a string, not " + describe(item)})
			continue
		}
		if rule := bad(s); rule != "" {
			errs.add(&FieldError{Path: ip, Value: display(s), Rule: rule})
			continue
		}
		out = append(out, s)
	}
	return out
}

// parseEndpoint reads {"host": ..., "port": ..., "phase": ...}. The host is a name or an
// address (a wildcard or range is not something a harness connects to); the port is
// required, either as the field or as a ":port" suffix.
func parseEndpoint(raw any, p string, errs *ErrorList) (Endpoint, bool) {
	obj, ok := raw.(map[string]any)
	if !ok {
		errs.add(&FieldError{Path: p, Value: display(raw), Rule: "an endpoint is an object {\"host\": ..., \"port\": ..., \"phase\": ...}, not " + describe(raw)})
		return Endpoint{}, false
	}
	n := len(*errs)
	checkKeys(obj, p, endpointKeys, "an endpoint", errs)
	var e Endpoint
	phaseRaw, ok := obj["phase"]
	if !ok {
		errs.add(&FieldError{Path: joinPath(p, "phase"), Rule: "is required (baseline, run, evaluation or evaluation_baseline)"})
	} else if s, isString := phaseRaw.(string); !isString || !contains(phaseNames(), s) {
		errs.add(&FieldError{Path: joinPath(p, "phase"), Value: display(phaseRaw), Rule: "unknown phase; use baseline, run, evaluation or evaluation_baseline"})
	} else {
		e.Phase = Phase(s)
	}
	target := map[string]any{}
	for _, k := range []string{"host", "port"} {
		if v, ok := obj[k]; ok {
			target[k] = v
		}
	}
	t, err := parseEntry(target, p)
	if err != nil {
		errs.add(FieldErrors(err)...)
		return Endpoint{}, false
	}
	switch {
	case t.Kind == KindWildcard || t.Kind == KindPrefix:
		errs.add(&FieldError{Path: joinPath(p, "host"), Value: display(obj["host"]), Rule: "an endpoint is one host name or address, not a wildcard or a range"})
	case t.Port == 0:
		errs.add(&FieldError{Path: joinPath(p, "port"), Rule: "is required: an endpoint is checked on the port the harness connects to"})
	}
	e.Target = t
	return e, len(*errs) == n
}

func phaseNames() []string {
	out := make([]string, len(Phases))
	for i, ph := range Phases {
		out[i] = string(ph)
	}
	return out
}

// decide checks an endpoint against a policy the way the proxy would see the
// connection: a name by host rules, an address by IP and CIDR rules and then by the
// internal-address guard, which refuses an internal address that only a rule wider than
// its class (or none, under a denylist) allows. What a name resolves to is not known
// here.
func (e Endpoint) decide(m *Matcher) Decision {
	if e.Target.Kind != KindAddr {
		return m.Decide(e.Target.Host, netip.Addr{}, e.Target.Port)
	}
	a := e.Target.Prefix.Addr()
	d := m.Decide("", a, e.Target.Port)
	if c, internal := addrguard.Classify(a); d.Allowed && internal && !m.Lifts(c, a, e.Target.Port) {
		d.Allowed, d.Reason = false, ReasonInternalAddress
	}
	return d
}
