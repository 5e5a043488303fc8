package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/policy"
)

func init() { subcommands = append(subcommands, newPlanCommand) }

type planOptions struct {
	tasks          []string
	envParams      string
	recipes        []string
	provider       string
	evaluationMode string
	json           bool
	// check is what the command needs of each plan beyond planning (run: docker.CheckTask).
	check func(*policy.Plan) []*policy.FieldError
}

func newPlanCommand() *cobra.Command {
	var o planOptions
	cmd := &cobra.Command{
		Use:   "plan --task FILE [--env-params JSON|@FILE] [--recipe FILE]... [--provider NAME] [--evaluation-mode shared|fresh] [--json]",
		Short: "Resolve each task's phase policies and check them against the provider",
		Long: `Resolve each task's four phase policies (override > task > recipe > default), check
them against the provider, and print the plan: effective policies and their sources, the
lifecycle steps with the mode in force at each, provider-native options and the
restriction statement. --provider and --evaluation-mode, when given, replace the task
files' values for every task. Nothing is printed on stdout when any task is invalid.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := refuseEmpty(cmd.Flags(), "env-params", "provider", "evaluation-mode"); err != nil {
				return err
			}
			return runPlan(cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.tasks, "task", nil, "task file (JSON or YAML: one task or a list); repeatable")
	f.StringVar(&o.envParams, "env-params", "", "run-wide override as JSON, or @FILE to read it from a file")
	f.StringArrayVar(&o.recipes, "recipe", nil, "recipe file; repeatable, earlier files win when two recipes supply a field")
	f.StringVar(&o.provider, "provider", "", "provider for every task: "+strings.Join(policy.ProviderNames(), ", ")+" (default: the task's, else docker)")
	f.StringVar(&o.evaluationMode, "evaluation-mode", "", "evaluation mode for every task: shared or fresh (default: the task's, else shared)")
	f.BoolVar(&o.json, "json", false, "print the plans as a JSON array")
	return cmd
}

func runPlan(out io.Writer, o planOptions) error {
	plans, err := buildPlans(o)
	if err != nil {
		return usageError{err}
	}
	if o.json {
		b, err := policy.MarshalPlans(plans)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	var buf bytes.Buffer
	writePlanTables(&buf, plans)
	_, err = out.Write(buf.Bytes())
	return err
}

// buildPlans reads every input and plans every task; it returns an error, and nothing
// else, if any input or task is invalid. The problems of every task come together: a
// task file's and, for the tasks that have none of their own, their plans'.
func buildPlans(o planOptions) ([]*policy.Plan, error) {
	if len(o.tasks) == 0 {
		return nil, fmt.Errorf("plan: --task FILE is required")
	}
	pl := policy.Planner{Provider: o.provider, EvaluationMode: policy.EvaluationMode(o.evaluationMode), Check: o.check}
	if o.envParams != "" {
		data, err := readInlineOrFile(o.envParams)
		if err != nil {
			return nil, err
		}
		ep, err := policy.ParseEnvParams(data)
		if err != nil {
			return nil, prefixed("--env-params: ", err)
		}
		pl.Override = ep
	}
	for _, file := range o.recipes {
		rs, err := policy.LoadRecipes(file)
		if err != nil {
			return nil, err
		}
		pl.Recipes = append(pl.Recipes, rs...)
	}
	var tasks []policy.Task
	var errs []error
	for _, file := range o.tasks {
		ts, err := policy.LoadTasks(file)
		if err != nil {
			errs = append(errs, err)
		}
		tasks = append(tasks, ts...)
	}
	seen := map[string]string{}
	for _, t := range tasks {
		if first, dup := seen[t.ID]; dup {
			errs = append(errs, fmt.Errorf("plan: task %q is defined twice (%s and %s)", t.ID, first, t.Origin))
		}
		seen[t.ID] = t.Origin
	}
	if err := pl.Validate(); err != nil {
		return nil, errors.Join(append(errs, prefixed("plan: --", err))...)
	}
	plans, err := pl.PlanAll(tasks)
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, err
	}
	return plans, nil
}

// readInlineOrFile returns the flag's value, or the contents of the file it names after
// an '@'.
func readInlineOrFile(v string) ([]byte, error) {
	name, isFile := strings.CutPrefix(v, "@")
	if !isFile {
		return []byte(v), nil
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--env-params: %w", err)
	}
	return data, nil
}

// prefixed puts prefix in front of every line of a (possibly multi-line) error.
func prefixed(prefix string, err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return fmt.Errorf("%s", strings.Join(lines, "\n"))
}

func writePlanTables(w io.Writer, plans []*policy.Plan) {
	for i, p := range plans {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "task %s  provider %s  evaluation mode %s\n", p.TaskID, p.Provider, p.EvaluationMode)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  PHASE\tMODE\tSOURCE\tPOLICY")
		for _, ph := range p.Phases() {
			rp := p.Policies[ph]
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", ph, rp.Policy.Mode, rp.Source, rp.Policy)
		}
		tw.Flush()
		recipes := "none"
		if len(p.AppliedRecipes) > 0 {
			recipes = strings.Join(p.AppliedRecipes, ", ")
		}
		fmt.Fprintf(w, "  applied recipes: %s\n", recipes)
		if p.Network != "" {
			fmt.Fprintf(w, "  docker network: %s\n", p.Network)
		}
		if p.ProxyStartTimeout != 0 {
			fmt.Fprintf(w, "  proxy start timeout: %s\n", p.ProxyStartTimeout)
		}
		if p.Native != nil {
			fmt.Fprintln(w, "  native options:")
			for _, ph := range p.Phases() {
				b, _ := json.Marshal(p.Native[ph])
				fmt.Fprintf(w, "    %-20s %s\n", ph, b)
			}
		}
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  STEP\tBOUNDARY\tENVIRONMENT\tPHASE\tMODE\tCONDITION")
		for _, s := range p.Steps {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", s.Number, s.Boundary, s.Environment, s.Phase, s.Mode, s.Condition)
		}
		tw.Flush()
		switch {
		case !p.InjectNotice:
			fmt.Fprintln(w, "  notice: off (inject_network_restriction_notice: false; enforcement unchanged)")
		case p.Notice == "":
			fmt.Fprintln(w, "  notice: none (the run policy restricts nothing)")
		default:
			fmt.Fprintln(w, "  notice:")
			for _, l := range strings.Split(p.Notice, "\n") {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
}
