package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/report.golden")

// testdata/events.jsonl is `go test -json ./...` of testdata/fixture: a package that
// passes with a skipped test, one with a failing test, one without tests, one that does
// not build.
func TestReportGolden(t *testing.T) {
	in, err := os.Open(filepath.Join("testdata", "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	r := newReport(&out)
	if err := r.read(in); err != nil {
		t.Fatal(err)
	}
	r.summary()
	if !r.failed {
		t.Error("a failed test and a failed build did not mark the run failed")
	}
	golden := filepath.Join("testdata", "report.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("report:\n%s\nwant (%s):\n%s", out.String(), golden, want)
	}
}

// The same fixture through this Go's own go test: the event format the report reads is
// the one the toolchain writes now.
func TestReportOfLiveRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the fixture's tests")
	}
	cmd := exec.Command("go", "test", "-count=1", "-json", "./...")
	cmd.Dir = filepath.Join("testdata", "fixture")
	events, _ := cmd.Output() // it fails: the fixture holds a failure
	var out bytes.Buffer
	r := newReport(&out)
	if err := r.read(bytes.NewReader(events)); err != nil {
		t.Fatal(err)
	}
	r.summary()
	for _, want := range []string{
		"undefined: undefined",
		"the failure's own message",
		"?   \tfixture/notests\t[no test files]",
		"ok  \tfixture/passes",
		"skipped tests (1), not run, so not passed:\n  fixture/passes TestSkips: passes_test.go:7: needs a thing this machine lacks\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "quiet when it passes") {
		t.Errorf("a passing test's log was printed:\n%s", out.String())
	}
}

// A run in which no test ran (a -run pattern that matches nothing: go test says "ok")
// fails, and says why; one in which a test passed does not.
func TestReportCountsTestsThatRan(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the fixture's tests")
	}
	for _, tc := range []struct {
		run        string
		wantFailed bool
	}{
		{"^TestNoSuchTest$", true},
		{"^TestPasses$", false},
	} {
		cmd := exec.Command("go", "test", "-count=1", "-json", "-run", tc.run, "./passes")
		cmd.Dir = filepath.Join("testdata", "fixture")
		events, err := cmd.Output()
		if err != nil {
			t.Fatalf("go test -run %s: %v (it passes)", tc.run, err)
		}
		var out bytes.Buffer
		r := newReport(&out)
		if err := r.read(bytes.NewReader(events)); err != nil {
			t.Fatal(err)
		}
		r.summary()
		if r.failed != tc.wantFailed || strings.Contains(out.String(), "no test ran") != tc.wantFailed {
			t.Errorf("-run %s: failed %v, report:\n%s\nwant failed %v, with a line saying no test ran if so", tc.run, r.failed, out.String(), tc.wantFailed)
		}
	}
}
