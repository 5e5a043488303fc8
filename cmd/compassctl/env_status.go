package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller/docker"
)

func newEnvStatusCommand(f *envFlags) *cobra.Command {
	var t taskFlags
	cmd := &cobra.Command{
		Use:   "status --task ID",
		Short: "Compare the intended policy with the sidecar, the Docker wiring and the agent's routes",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			role, err := t.parse()
			if err != nil {
				return err
			}
			e, done, err := f.lookup(cmd.Context(), t, role)
			if err != nil {
				return err
			}
			defer done()
			st, err := e.Status(cmd.Context())
			if err != nil {
				return err
			}
			if err := f.print(cmd.OutOrStdout(), st, func(w io.Writer) { statusText(w, st) }); err != nil {
				return err
			}
			if !st.OK {
				return fmt.Errorf("%s: %d problem(s): intended and actual state differ; `switch` to the intended policy repairs", st.Env, len(st.Problems))
			}
			return nil
		},
	}
	t.bind(cmd)
	return cmd
}

func statusText(w io.Writer, st docker.Status) {
	fmt.Fprintf(w, "environment %s (task %s, %s)\n", st.Env, st.Task, st.Role)
	if st.Intended != nil {
		fmt.Fprintf(w, "  intended  %s %s phase %s since %s\n", st.Intended.Mode, st.Intended.Digest, st.Intended.Phase, st.Intended.Since.Format(time.RFC3339))
	}
	s := st.Sidecar
	fmt.Fprintf(w, "  sidecar   running=%t ready=%t mode=%s generation=%d digest=%s phase=%s egress=%t task-net=%t\n",
		s.Running, s.Ready, s.Mode, s.Generation, s.Digest, s.Phase, s.OnEgress, s.OnTaskNet)
	fmt.Fprintf(w, "  agent     running=%t networks=%v default-routes=%v\n", st.Wiring.AgentRunning, st.Wiring.Networks, st.Wiring.DefaultRoutes)
	for _, t := range st.Transitions {
		ok := "ok"
		if !t.OK {
			ok = "FAILED"
		}
		fmt.Fprintf(w, "  switch    %s %s %s->%s gen %d %s %s\n", t.Time.Format(time.RFC3339), t.Phase, orNone(string(t.FromMode)), t.ToMode, t.Generation, t.Duration.Round(time.Millisecond), ok)
	}
	if st.OK {
		fmt.Fprintln(w, "  OK: intended and actual state match")
	}
	for _, p := range st.Problems {
		fmt.Fprintf(w, "  ERROR: %s\n", p)
	}
}

func newEnvListCommand(f *envFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the environments this controller manages on this host",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, done, err := f.provider()
			if err != nil {
				return err
			}
			defer done()
			list, err := p.List(cmd.Context())
			if err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), list, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ENV\tTASK\tROLE\tSIDECAR\tSTATE\tCREATED")
				for _, s := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Env, s.Task, s.Role, s.Sidecar, s.State, s.Created)
				}
				tw.Flush()
			})
		},
	}
}

func newEnvDoctorCommand(f *envFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check Docker, images, namespace access, the address pool and br_netfilter; print each fix",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, done, err := f.provider()
			if err != nil {
				return err
			}
			defer done()
			findings := p.Doctor(cmd.Context())
			failed := 0
			for _, x := range findings {
				if !x.OK {
					failed++
				}
			}
			if err := f.print(cmd.OutOrStdout(), findings, func(w io.Writer) {
				for _, x := range findings {
					mark := "ok  "
					if !x.OK {
						mark = "FAIL"
					}
					fmt.Fprintf(w, "%s %-22s %s\n", mark, x.Check, x.Detail)
					if x.Fix != "" {
						fmt.Fprintf(w, "     fix: %s\n", x.Fix)
					}
				}
			}); err != nil {
				return err
			}
			if failed > 0 {
				return fmt.Errorf("doctor: %d problem(s)", failed)
			}
			return nil
		},
	}
}
