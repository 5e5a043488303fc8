// Command testreport runs `go test -json` with the arguments it is given, prints what
// plain `go test` prints for a list of packages (a line per package, the output of
// whatever failed), and then every skipped test with its reason. Plain `go test` hides a
// skipped test behind its package's "ok", so a check that did not run would read as a
// check that passed (make test runs through this).
//
//	go run ./internal/testreport -race -count=1 ./...
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

func main() {
	cmd := exec.Command("go", append([]string{"test", "-json"}, os.Args[1:]...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r := newReport(os.Stdout)
	readErr := r.read(stdout)
	waitErr := cmd.Wait()
	r.summary()
	if readErr != nil {
		fmt.Fprintln(os.Stderr, "testreport:", readErr)
		os.Exit(2)
	}
	var exit *exec.ExitError
	if errors.As(waitErr, &exit) {
		os.Exit(exit.ExitCode())
	}
	if waitErr != nil || r.failed {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output events
}

type key struct{ pkg, test string }

// report turns the event stream into plain `go test` output.
type report struct {
	out    io.Writer
	output map[key][]string // output so far of each running test and package
	skips  []string         // "pkg TestX: reason", in the order they ended
	ran    bool             // a test passed or failed
	failed bool
}

func newReport(out io.Writer) *report {
	return &report{out: out, output: map[key][]string{}}
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event: go test's own message (a flag error, say). Pass it on.
			fmt.Fprintln(r.out, sc.Text())
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func (r *report) handle(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.out, e.Output)
	case "output":
		r.output[k] = append(r.output[k], e.Output)
	case "fail": // a test's output, or a package's (its FAIL line included)
		r.failed = true
		r.ran = r.ran || e.Test != ""
		fmt.Fprint(r.out, strings.Join(r.output[k], ""))
		delete(r.output, k)
	case "skip":
		if e.Test == "" { // a package without tests
			r.printSummaryLine(k)
		} else {
			r.skips = append(r.skips, e.Package+" "+e.Test+": "+reason(r.output[k]))
		}
		delete(r.output, k)
	case "pass":
		if e.Test == "" {
			r.printSummaryLine(k)
		} else {
			r.ran = true
		}
		delete(r.output, k)
	}
}

// printSummaryLine prints a finished package's "ok" or "?" line, which go test writes as
// the package's last output.
func (r *report) printSummaryLine(k key) {
	for _, line := range r.output[k] {
		if strings.HasPrefix(line, "ok  \t") || strings.HasPrefix(line, "?   \t") {
			fmt.Fprint(r.out, line)
		}
	}
}

// reason is what a skipped test logged (its t.Skip message), without the
// "=== RUN" and "--- SKIP" lines around it.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

func (r *report) summary() {
	if !r.ran {
		// A -run pattern that matches nothing makes go test print "ok": not a pass.
		r.failed = true
		fmt.Fprintln(r.out, "no test ran: a -run or -skip pattern that matches nothing is not a pass")
	}
	if len(r.skips) == 0 {
		fmt.Fprintln(r.out, "skipped tests: none")
		return
	}
	fmt.Fprintf(r.out, "skipped tests (%d), not run, so not passed:\n", len(r.skips))
	for _, s := range r.skips {
		fmt.Fprintln(r.out, "  "+s)
	}
}
