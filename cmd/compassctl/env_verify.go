package main

import (
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
)

func newEnvVerifyCommand(f *envFlags) *cobra.Command {
	var (
		task, role, outside string
		outsidePort         uint16
		allowed, blocked    []string
	)
	cmd := &cobra.Command{
		Use:   "verify --task ID [--allowed HOST:PORT]... [--blocked HOST:PORT]...",
		Short: "Adversarial check from inside the agent's network namespace; exit 1 on any unexpected outcome",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if task == "" {
				return usageError{fmt.Errorf("--task is required")}
			}
			envRole, err := parseRole(role)
			if err != nil {
				return err
			}
			opts := docker.VerifyOptions{Allowed: allowed, Blocked: blocked, OutsidePort: outsidePort}
			if outside != "" {
				a, err := netip.ParseAddr(outside)
				if err != nil {
					return usageError{fmt.Errorf("--outside: %w", err)}
				}
				opts.Outside = a
			}
			p, done, err := f.provider()
			if err != nil {
				return err
			}
			defer done()
			e, err := p.LookupTask(cmd.Context(), task, envRole)
			if err != nil {
				return err
			}
			rep, err := e.Verify(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := f.print(cmd.OutOrStdout(), rep, func(w io.Writer) { verifyText(w, rep) }); err != nil {
				return err
			}
			if !rep.OK {
				return errFailed
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&task, "task", "", "task ID")
	cmd.Flags().StringVar(&role, "role", string(controller.RoleAgent), "agent or evaluation")
	cmd.Flags().StringArrayVar(&allowed, "allowed", nil, "HOST:PORT that must work through the proxy (repeatable)")
	cmd.Flags().StringArrayVar(&blocked, "blocked", nil, "HOST:PORT that must fail through the proxy (repeatable)")
	cmd.Flags().StringVar(&outside, "outside", "", "an address outside the sandbox for the direct checks (default: the egress network's gateway)")
	cmd.Flags().Uint16Var(&outsidePort, "outside-port", 80, "TCP port of the direct check")
	return cmd
}

func verifyText(w io.Writer, rep docker.VerifyReport) {
	fmt.Fprintf(w, "verify %s under %s (%s)\n", rep.Env, rep.Mode, rep.Digest)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tTARGET\tEXPECTED\tOBSERVED\t\tDETAIL")
	for _, r := range rep.Rows {
		mark := "ok"
		if !r.OK {
			mark = "MISMATCH"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Check, r.Target, r.Expected, r.Observed, mark, r.Detail)
	}
	tw.Flush()
	if rep.OK {
		fmt.Fprintln(w, "OK: every outcome as expected")
	} else {
		fmt.Fprintln(w, "FAILED: some outcomes differ from the policy")
	}
}
