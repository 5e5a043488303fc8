package policy

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// EnvParams is the run-wide --env-params JSON: the explicit Environment override of
// docs/policy.md §4 (it applies to every task) plus the Docker provider's own parameters.
type EnvParams struct {
	// Policies holds the policy fields the override sets.
	Policies PhasePolicies
	// Network is the Docker network mode asked for; "" means the provider's default
	// (a per-task bridge network).
	Network string
	// ProxyStartTimeout bounds the egress sidecar's start-up; 0 means the default.
	ProxyStartTimeout time.Duration
}

// MaxProxyStartTimeout caps allowlist_proxy_start_timeout: a sidecar that needs longer
// than this is broken, and a run should fail rather than hang.
const MaxProxyStartTimeout = time.Hour

var envParamKeys = []string{
	"baseline_network_policy", "run_network_policy", "evaluation_network_policy",
	"evaluation_baseline_network_policy", "network", "allowlist_proxy_start_timeout",
}

// ParseEnvParams parses the --env-params JSON object. Empty input means no override.
func ParseEnvParams(data []byte) (EnvParams, error) {
	if strings.TrimSpace(string(data)) == "" {
		return EnvParams{}, nil
	}
	v, err := DecodeJSON(data)
	if err != nil {
		return EnvParams{}, err
	}
	return ParseEnvParamsValue(v)
}

// ParseEnvParamsValue validates an already decoded --env-params tree.
func ParseEnvParamsValue(v any) (EnvParams, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return EnvParams{}, ErrorList{{Value: display(v), Rule: "the env params are a JSON object, not " + describe(v)}}
	}
	var errs ErrorList
	checkKeys(obj, "", envParamKeys, "--env-params", &errs)
	ep := EnvParams{Policies: parsePhasePolicies(obj, "", &errs)}
	if raw, ok := obj["network"]; ok {
		ep.Network = parseNetwork(raw, &errs)
	}
	if raw, ok := obj["allowlist_proxy_start_timeout"]; ok {
		ep.ProxyStartTimeout = parseSeconds(raw, "allowlist_proxy_start_timeout", &errs)
	}
	if len(errs) > 0 {
		return EnvParams{}, errs
	}
	return ep, nil
}

func parseNetwork(raw any, errs *ErrorList) string {
	s, ok := raw.(string)
	switch {
	case !ok:
		errs.add(&FieldError{Path: "network", Value: display(raw), Rule: "must be a string naming a Docker network mode, not " + describe(raw)})
	case s == "" || strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		errs.add(&FieldError{Path: "network", Value: display(raw), Rule: "must be a non-empty Docker network name or mode without whitespace"})
	case s == "container:":
		errs.add(&FieldError{Path: "network", Value: display(raw), Rule: "container: needs a container ID or name"})
	default:
		return s
	}
	return ""
}

func parseSeconds(raw any, path string, errs *ErrorList) time.Duration {
	n, ok := raw.(json.Number)
	if !ok {
		errs.add(&FieldError{Path: path, Value: display(raw), Rule: "must be a number of seconds, not " + describe(raw)})
		return 0
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		errs.add(&FieldError{Path: path, Value: Clip(n.String()), Rule: "must be a positive number of seconds"})
		return 0
	}
	d := time.Duration(f * float64(time.Second))
	if d > MaxProxyStartTimeout {
		errs.add(&FieldError{Path: path, Value: Clip(n.String()), Rule: "must be at most 3600 seconds"})
		return 0
	}
	if d < time.Millisecond {
		errs.add(&FieldError{Path: path, Value: Clip(n.String()), Rule: "must be at least 0.001 seconds"})
		return 0
	}
	return d
}
