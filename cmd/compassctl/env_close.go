package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller/docker"
)

func newEnvCloseCommand(f *envFlags) *cobra.Command {
	var (
		t      taskFlags
		retain bool
	)
	cmd := &cobra.Command{
		Use:   "close --task ID [--retain]",
		Short: "Remove what open/attach made (idempotent); --retain keeps the environment running",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			role, err := t.parse()
			if err != nil {
				return err
			}
			p, done, err := f.provider()
			if err != nil {
				return err
			}
			defer done()
			env := docker.EnvID(t.task, role)
			// found is false only for --retain of an environment that does not exist:
			// nothing is retained, and the output must not say otherwise.
			found := true
			if retain {
				e, err := p.LookupTask(cmd.Context(), t.task, role)
				switch {
				case errors.Is(err, docker.ErrNoEnvironment):
					found = false
				case err != nil:
					return err
				default:
					if err := e.Close(cmd.Context(), true); err != nil {
						return err
					}
				}
			} else if err := p.RemoveTask(cmd.Context(), t.task, role); err != nil {
				// Idempotent: a second close, or one after a half-finished open, removes
				// whatever is left of this task's environment by name.
				return err
			}
			result := map[string]any{"env": env, "retained": retain && found}
			return f.print(cmd.OutOrStdout(), result, func(w io.Writer) {
				switch {
				case !found:
					fmt.Fprintf(w, "%s: no such environment, nothing retained\n", env)
				case retain:
					fmt.Fprintf(w, "%s retained (still running under the policy in force)\n", env)
				default:
					fmt.Fprintf(w, "%s closed\n", env)
				}
			})
		},
	}
	t.bind(cmd)
	cmd.Flags().BoolVar(&retain, "retain", false, "keep the environment (for debugging); a later close removes it")
	return cmd
}
