package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy"
)

// timeoutKeys are the steps a task file may bound under "timeouts".
var timeoutKeys = []policy.StepName{
	policy.StepOpen, policy.StepPrepare, policy.StepHarnessStart, policy.StepRun,
	policy.StepHarnessClose, policy.StepCollect, policy.StepDownload,
	policy.StepEvaluationOpen, policy.StepUpload, policy.StepEvaluate,
}

// taskRunOf turns a resolved plan and its task's runner fields into what the lifecycle
// runner executes. Every problem is reported, each naming the task and the field.
func taskRunOf(p *policy.Plan) (controller.TaskRun, error) {
	f := p.Task.Runner
	d := fieldDecoder{task: p.TaskID}
	t := controller.TaskRun{
		ID:                p.TaskID,
		Mode:              policy.EvaluationMode(p.EvaluationMode),
		Image:             d.str(f, "image", true),
		Policies:          phasePolicies(p),
		Notice:            p.Notice,
		InjectNotice:      p.InjectNotice,
		Prepare:           d.commands(f, "prepare"),
		Run:               d.commands(f, "run"),
		Collect:           d.commands(f, "collect"),
		Artifacts:         d.strings(f, "artifacts"),
		Evaluate:          d.commands(f, "evaluate"),
		Retain:            d.boolean(f, "retain", false),
		Timeouts:          d.timeouts(f),
		ProxyStartTimeout: p.ProxyStartTimeout,
	}
	// A path naming the container's root would be saved as the task's own output
	// directory (artifacts/ is the root's copy), next to its records.
	for i, a := range t.Artifacts {
		if path.Clean("/"+a) == "/" {
			d.failValue(fmt.Sprintf("artifacts[%d]", i), a, "names the container's whole file system; give the files or directories to save")
		}
	}
	// save_artifacts defaults to true when artifact paths are declared: declaring them
	// says they are wanted.
	t.SaveArtifacts = d.boolean(f, "save_artifacts", len(t.Artifacts) > 0)
	if p.EvaluationMode == policy.EvaluationFresh {
		t.EvaluationImage = d.str(f, "evaluation_image", true)
	} else if _, ok := f["evaluation_image"]; ok {
		d.fail("evaluation_image", "is only used in fresh evaluation mode")
	}
	if raw, ok := f["harness"]; ok {
		t.Harness = d.harness(raw)
	}
	if len(t.Run) == 0 {
		d.fail("run", "is required: the agent rollout's commands")
	}
	if p.Provider != "docker" {
		d.fail("provider", fmt.Sprintf("%q: compassctl run drives the docker provider only", p.Provider))
	}
	// Docker's names are shorter than the planner's IDs: refused here, before any task
	// of the run starts, not when this one opens.
	if err := docker.ValidateTask(p.TaskID); err != nil {
		d.fail("task_id", err.Error())
	}
	// The Docker provider wires each task onto its own internal network behind the
	// sidecar; any other network asked for would be silently replaced, so refuse it.
	if p.Network != "" && p.Network != "bridge" {
		d.fail("network", fmt.Sprintf("%q: compassctl run puts every task on its own internal bridge network behind the sidecar and cannot honour another network mode; omit network (or use bridge)", p.Network))
	}
	plan, err := json.Marshal(p)
	if err != nil {
		d.errs = append(d.errs, fmt.Errorf("task %q: plan: %w", p.TaskID, err))
	}
	t.Plan = plan
	return t, errors.Join(d.errs...)
}

func phasePolicies(p *policy.Plan) controller.PhasePolicies {
	pp := controller.PhasePolicies{
		Baseline:   p.Policy(policy.PhaseBaseline),
		Run:        p.Policy(policy.PhaseRun),
		Evaluation: p.Policy(policy.PhaseEvaluation),
	}
	if p.EvaluationMode == policy.EvaluationFresh {
		pp.EvaluationBaseline = p.Policy(policy.PhaseEvaluationBaseline)
	}
	return pp
}

// fieldDecoder reads the runner's fields from the planner's generic tree, collecting
// every error.
type fieldDecoder struct {
	task string
	errs []error
}

func (d *fieldDecoder) fail(field, rule string) {
	d.errs = append(d.errs, fmt.Errorf("task %q: %s: %s", d.task, field, rule))
}

// failValue is fail for a value that is there but wrong: the message shows it.
func (d *fieldDecoder) failValue(field string, raw any, rule string) {
	d.fail(field+" "+policy.Display(raw), rule)
}

func (d *fieldDecoder) str(f map[string]any, key string, required bool) string {
	raw, ok := f[key]
	if !ok {
		if required {
			d.fail(key, "is required")
		}
		return ""
	}
	s, ok := raw.(string)
	if !ok || strings.TrimSpace(s) == "" {
		d.failValue(key, raw, "must be a non-empty string")
	}
	return s
}

func (d *fieldDecoder) boolean(f map[string]any, key string, def bool) bool {
	raw, ok := f[key]
	if !ok {
		return def
	}
	b, ok := raw.(bool)
	if !ok {
		d.failValue(key, raw, "must be true or false")
	}
	return b
}

func (d *fieldDecoder) strings(f map[string]any, key string) []string {
	raw, ok := f[key]
	if !ok {
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		d.failValue(key, raw, "must be a list of strings")
		return nil
	}
	out := make([]string, 0, len(list))
	for i, v := range list {
		s, ok := v.(string)
		if !ok || s == "" {
			d.failValue(fmt.Sprintf("%s[%d]", key, i), v, "must be a non-empty string")
			continue
		}
		out = append(out, s)
	}
	return out
}

// commands reads a list of commands: each a string (split into words as a shell would,
// quotes kept together; no shell runs it) or a list of argument strings.
func (d *fieldDecoder) commands(f map[string]any, key string) []controller.Command {
	raw, ok := f[key]
	if !ok {
		return nil
	}
	return d.commandList(raw, key)
}

func (d *fieldDecoder) commandList(raw any, path string) []controller.Command {
	list, ok := raw.([]any)
	if !ok {
		d.failValue(path, raw, "must be a list of commands")
		return nil
	}
	var out []controller.Command
	for i, v := range list {
		at := fmt.Sprintf("%s[%d]", path, i)
		switch c := v.(type) {
		case string:
			argv, err := splitWords(c)
			if err != nil {
				d.fail(at, err.Error())
				continue
			}
			out = append(out, argv)
		case []any:
			argv := make(controller.Command, 0, len(c))
			for _, a := range c {
				s, ok := a.(string)
				if !ok {
					d.failValue(at, a, "argument lists hold strings only")
					break
				}
				argv = append(argv, s)
			}
			if len(argv) == 0 {
				d.fail(at, "is an empty command")
				continue
			}
			out = append(out, argv)
		default:
			d.failValue(at, v, "must be a string or a list of strings")
		}
	}
	return out
}

func (d *fieldDecoder) harness(raw any) *controller.HarnessSession {
	obj, ok := raw.(map[string]any)
	if !ok {
		d.failValue("harness", raw, "must be an object with start and close")
		return nil
	}
	h := &controller.HarnessSession{}
	// In key order, so that the problems come in the same order on every run.
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := obj[k]
		switch k {
		case "start":
			h.Start = d.commandList(v, "harness.start")
		case "close":
			h.Close = d.commandList(v, "harness.close")
		default:
			d.fail("harness."+k, "unknown key (known: start, close)")
		}
	}
	return h
}

func (d *fieldDecoder) timeouts(f map[string]any) map[policy.StepName]time.Duration {
	raw, ok := f["timeouts"]
	if !ok {
		return nil
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		d.failValue("timeouts", raw, "must be an object of step: duration")
		return nil
	}
	known := map[string]bool{}
	names := make([]string, len(timeoutKeys))
	for i, k := range timeoutKeys {
		known[string(k)], names[i] = true, string(k)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[policy.StepName]time.Duration{}
	for _, k := range keys {
		if !known[k] {
			d.fail("timeouts."+k, "unknown step (known: "+strings.Join(names, ", ")+")")
			continue
		}
		dur, err := parseTimeout(obj[k])
		if err != nil {
			d.fail("timeouts."+k, err.Error())
			continue
		}
		out[policy.StepName(k)] = dur
	}
	return out
}

// parseTimeout accepts a Go duration ("10m", "90s") or a number of seconds.
func parseTimeout(v any) (time.Duration, error) {
	var dur time.Duration
	switch x := v.(type) {
	case string:
		dd, err := time.ParseDuration(x)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (e.g. 90s, 10m)", x)
		}
		dur = dd
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsNaN(f) {
			return 0, fmt.Errorf("%s is not a number of seconds", x)
		}
		// Checked before converting: a float beyond int64 converts to whatever the
		// platform gives (negative on amd64, the maximum on arm64).
		if f >= float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("%s seconds is longer than the longest timeout, %s", x, time.Duration(math.MaxInt64))
		}
		dur = time.Duration(f * float64(time.Second))
	default:
		return 0, errors.New("must be a duration string or a number of seconds")
	}
	if dur <= 0 {
		return 0, errors.New("must be positive")
	}
	return dur, nil
}

// splitWords splits a command line into words the way a POSIX shell would for plain
// words and quotes ('...', "...", backslash escapes); no expansion of any kind.
func splitWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case quote == '"':
			switch {
			case r == '"':
				quote = 0
			case r == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
				i++
				cur.WriteRune(rs[i])
			default:
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '\\':
			if i+1 == len(rs) {
				return nil, errors.New("ends with a lone backslash")
			}
			i++
			cur.WriteRune(rs[i])
			in = true
		case r == ' ' || r == '\t' || r == '\n':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("is an empty command")
	}
	return words, nil
}
