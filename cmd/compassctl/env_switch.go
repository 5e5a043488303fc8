package main

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
)

func newEnvSwitchCommand(f *envFlags) *cobra.Command {
	var (
		t          taskFlags
		labelPhase string
		src        policySource
	)
	cmd := &cobra.Command{
		Use:   "switch --task ID (--policy POLICY | --phase PHASE --plan FILE) [--label-phase NAME]",
		Short: "Put a policy in force; returns when the sidecar acknowledged it and the wiring matches",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkTask(t.task); err != nil {
				return err
			}
			if err := src.checkGiven(); err != nil {
				return err
			}
			if src.policy == "" && src.plan == "" {
				return usageError{fmt.Errorf("give --policy, or --phase with --plan")}
			}
			if src.plan != "" && src.phase == "" {
				return usageError{fmt.Errorf("--plan needs --phase (baseline, run, evaluation or evaluation_baseline)")}
			}
			role, err := parseRole(t.role)
			if err != nil {
				return err
			}
			pol, phase, err := src.resolve(t.task, "switch")
			if err != nil {
				return err
			}
			if labelPhase != "" {
				phase = labelPhase
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			e, done, err := f.lookup(ctx, t, role)
			if err != nil {
				return err
			}
			defer done()
			r, err := e.Switch(ctx, pol, controller.PhaseLabel{Phase: phase})
			if perr := f.print(cmd.OutOrStdout(), r, func(w io.Writer) { switchText(w, r) }); perr != nil && err == nil {
				err = perr
			}
			return err
		},
	}
	t.bind(cmd)
	cmd.Flags().StringVar(&labelPhase, "label-phase", "", "phase name for logs, metrics and the transition record")
	src.bind(cmd, "baseline, run, evaluation or evaluation_baseline: the plan's phase to apply")
	return cmd
}

func switchText(w io.Writer, r docker.SwitchReport) {
	verdict := "in force"
	if !r.OK {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "%s: %s -> %s (%s) generation %d %s in %s\n", r.Environment, orNone(string(r.FromMode)), r.ToMode, r.Digest, r.Generation, verdict, r.Duration.Round(time.Microsecond))
	for _, c := range r.Changes {
		fmt.Fprintf(w, "  changed: %s\n", c)
	}
	parts := make([]string, 0, len(r.Parts))
	for k := range r.Parts {
		parts = append(parts, k)
	}
	sort.Strings(parts)
	for _, k := range parts {
		fmt.Fprintf(w, "  %-8s %s\n", k, r.Parts[k].Round(time.Microsecond))
	}
	for _, c := range r.FailClosed {
		fmt.Fprintf(w, "  fail-closed: %s\n", c)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
