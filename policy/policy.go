package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Mode is a policy's network mode.
type Mode string

const (
	ModePublic    Mode = "public"
	ModeNoNetwork Mode = "no-network"
	ModeAllowlist Mode = "allowlist"
	ModeDenylist  Mode = "denylist"
)

// Modes lists every mode in the order documents present them.
var Modes = []Mode{ModePublic, ModeNoNetwork, ModeAllowlist, ModeDenylist}

// Valid reports whether m is one of the four modes.
func (m Mode) Valid() bool {
	for _, k := range Modes {
		if m == k {
			return true
		}
	}
	return false
}

// withArticle names a policy of this mode in a sentence: "an allowlist policy".
func (m Mode) withArticle() string {
	if m == ModeAllowlist {
		return "an allowlist policy"
	}
	return "a " + string(m) + " policy"
}

// listKey is the host-list key that goes with a mode ("" for modes that take none).
func (m Mode) listKey() string {
	switch m {
	case ModeAllowlist:
		return "allowed_hosts"
	case ModeDenylist:
		return "denied_hosts"
	}
	return ""
}

// Policy is one parsed, canonical network policy. Targets is nil for public and
// no-network, and holds allowed (allowlist) or denied (denylist) targets otherwise, in
// the order first written, exact duplicates dropped.
type Policy struct {
	Mode    Mode
	Targets []Target
}

// Public and NoNetwork are the two list-less policies.
var (
	Public    = Policy{Mode: ModePublic}
	NoNetwork = Policy{Mode: ModeNoNetwork}
)

// Restricted reports whether the policy limits egress at all (everything but public).
func (p Policy) Restricted() bool { return p.Mode != ModePublic }

// Strings is the canonical wire form of each target.
func (p Policy) Strings() []string {
	out := make([]string, len(p.Targets))
	for i, t := range p.Targets {
		out[i] = t.String()
	}
	return out
}

// MarshalJSON writes the canonical wire form: a bare string for public and no-network,
// an object with the mode's host list otherwise.
func (p Policy) MarshalJSON() ([]byte, error) {
	switch p.Mode {
	case ModePublic, ModeNoNetwork:
		return json.Marshal(string(p.Mode))
	case ModeAllowlist, ModeDenylist:
		var b strings.Builder
		b.WriteString(`{"network_mode":`)
		b.WriteString(strconv.Quote(string(p.Mode)))
		b.WriteString(`,"`)
		b.WriteString(p.Mode.listKey())
		b.WriteString(`":[`)
		for i, t := range p.Targets {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Quote(t.String()))
		}
		b.WriteString("]}")
		return []byte(b.String()), nil
	}
	return nil, fmt.Errorf("policy: cannot marshal invalid mode %s", Quote(string(p.Mode)))
}

// UnmarshalJSON parses the wire format strictly (every rule of the policy language).
func (p *Policy) UnmarshalJSON(data []byte) error {
	v, err := DecodeJSON(data)
	if err != nil {
		return err
	}
	parsed, err := ParseValue(v, "")
	if err != nil {
		return err
	}
	*p = parsed
	return nil
}

// String is the canonical wire form as text.
func (p Policy) String() string {
	b, err := p.MarshalJSON()
	if err != nil {
		return "invalid"
	}
	return string(b)
}

// Digest identifies the policy: the SHA-256 of its canonical wire form, so two
// spellings of its entries share a digest. The canonical form keeps the order first
// written, and so does the digest.
func (p Policy) Digest() string {
	sum := sha256.Sum256([]byte(p.String()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Equal reports whether two policies have the same canonical form.
func (p Policy) Equal(q Policy) bool { return p.String() == q.String() }

// Parse parses a policy document (JSON, or YAML written by people).
func Parse(data []byte) (Policy, error) {
	v, err := DecodeDocument(data)
	if err != nil {
		return Policy{}, err
	}
	return ParseValue(v, "")
}

// nativeKnobs are provider-specific options that users sometimes paste into a policy.
// They are refused by name, because adapters generate them from the shared fields.
var nativeKnobs = map[string]string{
	"block_network":             "modal",
	"cidr_allowlist":            "modal",
	"outbound_cidr_allowlist":   "modal",
	"outbound_domain_allowlist": "modal",
	"network_allow_list":        "daytona",
	"networkBlockAll":           "daytona",
	"networkAllowList":          "daytona",
	"domainAllowList":           "daytona",
	"network_block_all":         "daytona",
	"network":                   "docker",
	"network_disabled":          "docker",
}

var policyKeys = []string{"network_mode", "allowed_hosts", "denied_hosts"}

// ParseValue validates one policy given as a generic tree (see DecodeDocument). path
// names the field holding it ("run_network_policy") and prefixes every error. All
// problems are reported together as an ErrorList.
func ParseValue(v any, path string) (Policy, error) {
	var errs ErrorList
	at := func(sub string) string { return joinPath(path, sub) }
	fail := func(p, value, format string, args ...any) {
		errs.add(&FieldError{Path: p, Value: value, Rule: fmt.Sprintf(format, args...)})
	}
	wholePath := path
	if wholePath == "" {
		wholePath = "policy"
	}

	switch x := v.(type) {
	case string:
		m := Mode(x)
		switch m {
		case ModePublic, ModeNoNetwork:
			return Policy{Mode: m}, nil
		case ModeAllowlist, ModeDenylist:
			fail(wholePath, display(x), "%s needs the object form with %q", m, m.listKey())
		default:
			fail(wholePath, display(x), "unknown network mode; use one of %s", modeList())
		}
		return Policy{}, errs.err()
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if provider, ok := nativeKnobs[k]; ok {
				fail(at(k), "", "%s is a provider-native (%s) option; write the shared fields (network_mode, allowed_hosts, denied_hosts) and the adapter generates it", k, provider)
			} else if !contains(policyKeys, k) {
				fail(at(Clip(k)), "", "unknown key; a policy object takes only %s", strings.Join(policyKeys, ", "))
			}
		}
		rawMode, ok := x["network_mode"]
		if !ok {
			fail(at("network_mode"), "", "is required in the object form")
			return Policy{}, errs.err()
		}
		ms, ok := rawMode.(string)
		if !ok || !Mode(ms).Valid() {
			fail(at("network_mode"), display(rawMode), "unknown network mode; use one of %s", modeList())
			return Policy{}, errs.err()
		}
		m := Mode(ms)
		for _, k := range []string{"allowed_hosts", "denied_hosts"} {
			if _, present := x[k]; present && k != m.listKey() {
				if m.listKey() == "" {
					fail(at(k), "", "%s takes no host list", m.withArticle())
				} else {
					fail(at(k), "", "%s takes %s, not %s", m.withArticle(), m.listKey(), k)
				}
			}
		}
		p := Policy{Mode: m}
		if key := m.listKey(); key != "" {
			raw, present := x[key]
			if !present {
				fail(at(key), "", "is required for %s (an empty list is valid)", m.withArticle())
			} else if list, ok := raw.([]any); !ok {
				fail(at(key), display(raw), "must be a list of targets, not %s", describe(raw))
			} else {
				p.Targets = parseTargets(list, at(key), &errs)
			}
		}
		if len(errs) > 0 {
			return Policy{}, errs
		}
		return p, nil
	default:
		fail(wholePath, display(v), "a policy is a string (\"public\", \"no-network\") or an object, not %s", describe(v))
		return Policy{}, errs.err()
	}
}

func modeList() string {
	names := make([]string, len(Modes))
	for i, m := range Modes {
		names[i] = string(m)
	}
	return strings.Join(names, ", ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseTargets validates each entry and drops exact duplicates (after canonicalisation).
func parseTargets(list []any, path string, errs *ErrorList) []Target {
	out := make([]Target, 0, len(list))
	seen := make(map[Target]struct{}, len(list))
	for i, raw := range list {
		p := fmt.Sprintf("%s[%d]", path, i)
		t, err := parseEntry(raw, p)
		if err != nil {
			errs.add(FieldErrors(err)...)
			continue
		}
		if _, dup := seen[t]; dup {
			continue
		}
		seen[t] = struct{}{}
		out = append(out, t)
	}
	return out
}

var entryKeys = []string{"host", "port"}

func parseEntry(raw any, path string) (Target, error) {
	switch e := raw.(type) {
	case string:
		t, err := ParseTarget(e)
		if err != nil {
			return Target{}, located(err, path, display(e))
		}
		return t, nil
	case map[string]any:
		var errs ErrorList
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !contains(entryKeys, k) {
				errs.add(&FieldError{Path: joinPath(path, Clip(k)), Rule: "unknown key; a target object takes only host and port"})
			}
		}
		rawHost, ok := e["host"]
		if !ok {
			errs.add(&FieldError{Path: joinPath(path, "host"), Rule: "is required in a target object"})
			return Target{}, errs
		}
		host, ok := rawHost.(string)
		if !ok {
			errs.add(&FieldError{Path: joinPath(path, "host"), Value: display(rawHost), Rule: "must be a string, not " + describe(rawHost)})
			return Target{}, errs
		}
		t, err := ParseTarget(host)
		if err != nil {
			errs.add(FieldErrors(located(err, joinPath(path, "host"), display(host)))...)
			return Target{}, errs
		}
		if rawPort, ok := e["port"]; ok {
			port, perr := parsePortValue(rawPort)
			switch {
			case perr != nil:
				errs.add(&FieldError{Path: joinPath(path, "port"), Value: display(rawPort), Rule: perr.Rule})
			case t.Port != 0:
				errs.add(&FieldError{Path: path, Value: display(host), Rule: "give the port either as a ':port' suffix or as the port field, not both"})
			default:
				t.Port = port
			}
		}
		if len(errs) > 0 {
			return Target{}, errs
		}
		return t, nil
	}
	return Target{}, &FieldError{Path: path, Value: display(raw), Rule: "a target is a string or an object {\"host\": ..., \"port\": ...}, not " + describe(raw)}
}

func parsePortValue(v any) (uint16, *FieldError) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, ruleErr("the port must be an integer, not %s", describe(v))
	}
	s := n.String()
	for _, c := range s {
		if (c < '0' || c > '9') && c != '-' {
			return 0, ruleErr("the port must be an integer")
		}
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil || i < 1 || i > 65535 {
		return 0, ruleErr("the port must be in 1..65535")
	}
	return uint16(i), nil
}

// located fills in the path and value of an error that ParseTarget returned bare.
func located(err error, path, value string) error {
	fes := FieldErrors(err)
	if len(fes) == 0 {
		return &FieldError{Path: path, Value: value, Rule: err.Error()}
	}
	out := make(ErrorList, len(fes))
	for i, fe := range fes {
		c := *fe
		if c.Path == "" {
			c.Path = path
		}
		if c.Value == "" {
			c.Value = value
		}
		out[i] = &c
	}
	return out
}
