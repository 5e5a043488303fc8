package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestUsageLinesNameRealFlags: every --flag a command's usage line names is one of its
// flags, so --help cannot advertise a spelling the command refuses.
func TestUsageLinesNameRealFlags(t *testing.T) {
	flagRE := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		for _, m := range flagRE.FindAllStringSubmatch(c.Use, -1) {
			if c.Flags().Lookup(m[1]) == nil && c.InheritedFlags().Lookup(m[1]) == nil {
				t.Errorf("%s: usage %q names --%s, which is not a flag of it", c.CommandPath(), c.Use, m[1])
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand())
}

// TestUsageLinesSayWhatIsRequired: a usage line must not show as optional what the
// command refuses to run without, nor leave out a value it takes.
func TestUsageLinesSayWhatIsRequired(t *testing.T) {
	tests := []struct {
		path    []string
		want    []string
		notWant []string
	}{
		// switch refuses --phase without --plan and --plan without --phase, and takes
		// evaluation_baseline as well.
		{[]string{"env", "switch"}, []string{"--phase PHASE --plan FILE"}, []string{"[--plan FILE]"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.path, " "), func(t *testing.T) {
			c, _, err := newRootCommand().Find(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(c.Use, w) {
					t.Errorf("usage %q lacks %q", c.Use, w)
				}
			}
			for _, nw := range tt.notWant {
				if strings.Contains(c.Use, nw) {
					t.Errorf("usage %q shows %q", c.Use, nw)
				}
			}
		})
	}
}
