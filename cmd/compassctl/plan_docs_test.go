package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestDocsConsoleExamples runs every "$ compassctl ..." line of the console blocks in
// docs/policy.md and checks that the lines under it are exactly what compassctl prints
// (stdout, then stderr), so the user documentation cannot drift from the code.
func TestDocsConsoleExamples(t *testing.T) {
	t.Chdir("../..")
	f, err := os.Open("docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type example struct {
		line int
		cmd  string
		want []string
	}
	var examples []example
	inConsole := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case line == "```console":
			inConsole = true
		case inConsole && line == "```":
			inConsole = false
		case inConsole && strings.HasPrefix(line, "$ "):
			examples = append(examples, example{line: n, cmd: strings.TrimPrefix(line, "$ ")})
		case inConsole && len(examples) > 0:
			examples[len(examples)-1].want = append(examples[len(examples)-1].want, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(examples) < 5 {
		t.Fatalf("found %d console examples in docs/policy.md; the parser or the page is broken", len(examples))
	}
	for _, ex := range examples {
		args, err := splitShellWords(ex.cmd)
		if err != nil || len(args) == 0 || args[0] != "compassctl" {
			t.Errorf("docs/policy.md:%d: cannot run %q (%v)", ex.line, ex.cmd, err)
			continue
		}
		_, stdout, stderr := runCaptured(t, args[1:]...)
		want := strings.Join(ex.want, "\n") + "\n"
		if got := stdout + stderr; got != want {
			t.Errorf("docs/policy.md:%d: %s\nprints\n%s\nthe page shows\n%s", ex.line, ex.cmd, got, want)
		}
	}
}

// splitShellWords splits a command line the way a POSIX shell would for the simple
// forms the docs use: bare words, '...' and "..." (with \" and \\ inside).
func splitShellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated double quote")
			}
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
