// Command compassctl is the compass-egress controller: it plans each task's phase
// policies, drives Docker to enforce them, verifies isolation and runs task lifecycles.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/compass-egress/compass-egress/internal/buildinfo"
)

// usageError marks bad input: compassctl exits 2 for it, 1 for other failures.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "compassctl",
		Short:         "Plan, enforce and verify per-phase egress policies for agent sandboxes",
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          groupArgs,
		RunE:          func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	return root
}

// groupArgs refuses any argument to a command that only groups subcommands: left to
// cobra, a mistyped subcommand printed the help and exited 0 (1 at the root), which a
// script reads as success.
func groupArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
	}
	return nil
}

// refuseEmpty refuses a flag given with an empty value (an unset shell variable): read
// as absent, it would fall back to the default or the task files' value in silence.
func refuseEmpty(fs *pflag.FlagSet, names ...string) error {
	for _, name := range names {
		if f := fs.Lookup(name); f != nil && f.Changed && f.Value.String() == "" {
			return usageError{fmt.Errorf("--%s \"\": is empty; give a value, or omit the flag for the default", name)}
		}
	}
	return nil
}

// subcommands is filled by each command's file in init, so that each command lives in
// its own file and no file lists the others.
var subcommands []func() *cobra.Command

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := newRootCommand()
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "compassctl:", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}
