package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The checks of positional arguments and flag values the commands share: each refuses
// as a usage error (exit 2) that names what is wrong.

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

// noArgs refuses any argument to a command that takes none.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", args[0])}
	}
	return nil
}

// exactArgs takes the named arguments, none empty, and says which one is missing or
// empty, or which is one too many.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		want := strings.Join(names, " ")
		switch {
		case len(args) < len(names):
			return usageError{fmt.Errorf("want %s: %s is missing", want, names[len(args)])}
		case len(args) > len(names):
			return usageError{fmt.Errorf("want %s: %q is one argument too many", want, args[len(names)])}
		}
		for i, a := range args {
			if a == "" {
				return usageError{fmt.Errorf("want %s: %s is empty", want, names[i])}
			}
		}
		return nil
	}
}
