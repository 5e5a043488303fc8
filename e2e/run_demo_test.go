package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// expected is what the demo must show: per step, who tried what, and the outcome.
var expected = map[string]map[string]string{
	"prepare": {
		"setup/fetch a package":     "reached",
		"setup/resolve":             "reached",
		"setup/direct by IP":        "reached",
		"setup/UDP echo":            "reached",
		"setup/hard-coded resolver": "reached",
	},
	"harness_start": {"harness/install the harness": "reached"},
	"run": {
		"agent/model via proxy":               "reached",
		"agent/exfil via proxy":               "blocked",
		"agent/exfil via the model's address": "blocked",
		// A client that ignores the proxy variables: the transparent path.
		"agent/model, ignoring the proxy":       "reached",
		"agent/exfil, ignoring the proxy":       "blocked",
		"agent/exfil direct by IP":              "blocked",
		"agent/SSH-like exchange":               "reached",
		"agent/exfil over UDP":                  "blocked",
		"agent/exfil via a hard-coded resolver": "blocked",
		"agent/exfil over DNS":                  "blocked",
	},
	"harness_close": {"harness/close the model session": "reached"},
	"evaluate": {
		"grader/judge via proxy": "reached",
		"grader/exfil via proxy": "blocked",
	},
}

// TestDemo is `make demo`: the two example tasks (examples/demo) run against a local
// fake internet, and a table per task shows what was attempted in each phase and what
// happened. The test checks every row of that table. With COMPASS_DEMO_OUT set, the
// records are kept there.
func TestDemo(t *testing.T) {
	demoImages(t)
	t.Parallel()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("COMPASS_DEMO_OUT")
	if out == "" {
		out = t.TempDir()
	}
	r := startRun(t, context.Background(),
		filepath.Join(root, "examples", "demo", "shared.yaml"), filepath.Join(root, "examples", "demo", "fresh.yaml"),
		"--out", out, "--concurrency", "2")
	code, text := r.wait(t, 5*time.Minute)
	fmt.Printf("\n$ compassctl run examples/demo/shared.yaml examples/demo/fresh.yaml --out %s --concurrency 2\n%s\n", out, text)
	if code != 0 {
		t.Errorf("compassctl run: exit status %d", code)
	}
	for _, task := range []string{"demo-shared", "demo-fresh"} {
		dir := filepath.Join(out, task)
		rec, err := controller.ReadRecord(dir)
		if err != nil {
			t.Fatal(err)
		}
		rows := demoRows(t, dir, rec)
		writeDemoTable(os.Stdout, dir, rec, rows)
		checkDemo(t, task, rec, rows)
		if left := taskLeftovers(t, task); len(left) > 0 {
			t.Errorf("%s left behind: %v", task, left)
		}
	}
}

// demoRow is one line of the demo table.
type demoRow struct {
	step, phase, mode string
	Attempt
}

func demoRows(t *testing.T, dir string, rec *controller.Record) []demoRow {
	var rows []demoRow
	for _, s := range rec.Steps {
		for _, a := range attemptsOf(t, dir, s) {
			rows = append(rows, demoRow{step: string(s.Name), phase: s.Phase, mode: string(s.Mode), Attempt: a})
		}
	}
	return rows
}

func writeDemoTable(w io.Writer, dir string, rec *controller.Record, rows []demoRow) {
	fmt.Fprintf(w, "\n%s (%s evaluation): %s\n", rec.Task, rec.EvaluationMode, rec.Status)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP\tPOLICY IN FORCE\tWHO\tATTEMPT\tTARGET\tOUTCOME")
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%s: %s\t%s\t%s\t%s\t%s\n", r.step, r.phase, r.mode, r.Who, r.Attempt.Attempt, r.Target, strings.ToUpper(r.Outcome))
	}
	tw.Flush()
	fmt.Fprintln(w, "  blocked at the sidecar, per phase:")
	for _, b := range rec.Blocked {
		if b.Summary.Total == 0 {
			continue
		}
		var top []string
		for _, t := range b.Summary.Top {
			top = append(top, blockedLabel(t)+fmt.Sprintf(" x%d", t.Count))
		}
		fmt.Fprintf(w, "    %s %s (%s): %d  %s%s\n", b.Environment, b.Phase, b.Mode, b.Summary.Total, strings.Join(top, ", "), droppedText(b.Dropped))
	}
	fmt.Fprintf(w, "  record: %s\n", filepath.Join(dir, controller.RecordFile))
}

// blockedLabel names a blocked destination as the summary shows it: "host:port type",
// with the protocol a transparent connection was read as ("exfil.test:80
// transparent/http"); a DNS name has no port.
func blockedLabel(t adminapi.BlockedTarget) string {
	dst := t.Host
	if t.Port != 0 {
		dst = net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port)))
	}
	kind := t.Type
	if t.Protocol != "" {
		kind += "/" + t.Protocol
	}
	return dst + " " + kind
}

// droppedText is what the transparent path dropped in a phase (UDP, ICMP, ...), for the
// summary line; empty when it dropped nothing.
func droppedText(d controller.Drops) string {
	var parts []string
	for _, class := range slices.Sorted(maps.Keys(d)) {
		if n := d[class].Packets; n > 0 {
			parts = append(parts, fmt.Sprintf("%s x%d", class, n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; dropped: " + strings.Join(parts, ", ")
}

func checkDemo(t *testing.T, task string, rec *controller.Record, rows []demoRow) {
	t.Helper()
	if rec.Status != controller.StatusSucceeded {
		t.Errorf("%s: status %s: %s", task, rec.Status, rec.Error)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		key := r.Who + "/" + r.Attempt.Attempt
		want, ok := expected[r.step][key]
		if !ok {
			t.Errorf("%s: unexpected attempt in %s: %+v", task, r.step, r)
			continue
		}
		seen[r.step+" "+key] = true
		if r.Outcome != want {
			t.Errorf("%s: %s %s %s: %s, want %s (%s)", task, r.step, key, r.Target, r.Outcome, want, r.Detail)
		}
	}
	var missing []string
	for step, m := range expected {
		if (step == "harness_start" || step == "harness_close") && task != "demo-fresh" {
			continue
		}
		for key := range m {
			if !seen[step+" "+key] {
				missing = append(missing, step+" "+key)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s: attempts missing from the table: %v", task, missing)
	}
	checkDemoBlocked(t, task, rec, rows)
	for _, tn := range rec.Transitions {
		if !tn.OK {
			t.Errorf("%s: failed transition %+v", task, tn)
		}
	}
	if !rec.Notice.Injected {
		t.Errorf("%s: notice not written: %+v", task, rec.Notice)
	}
	if len(rec.Artifacts) != 1 || !rec.Artifacts[0].Saved {
		t.Errorf("%s: artifacts %+v", task, rec.Artifacts)
	}
}

// checkDemoBlocked checks that the sidecar recorded what the table says it refused: in
// the run phase, the proxied exfiltration, the transparent path's refusals by name and
// by address, the DNS lookups and the dropped datagram; in grading, the grader's attempt.
func checkDemoBlocked(t *testing.T, task string, rec *controller.Record, rows []demoRow) {
	t.Helper()
	var addr string
	for _, r := range rows {
		if r.step == "prepare" && r.Who+"/"+r.Attempt.Attempt == "setup/resolve" {
			addr = r.Detail
		}
	}
	want := map[string][]string{
		string(policy.PhaseRun): {
			"exfil.test:80 http", "exfil.test:443 tls", "answer-42.exfil.test dns",
			"exfil.test:80 transparent/http", net.JoinHostPort(addr, "80") + " transparent/http",
		},
		string(policy.PhaseEvaluation): {"exfil.test:80 http"},
	}
	got := map[string][]string{}
	var runDropped uint64
	for _, b := range rec.Blocked {
		for _, bt := range b.Summary.Top {
			got[b.Phase] = append(got[b.Phase], blockedLabel(bt))
		}
		if b.Phase == string(policy.PhaseRun) {
			runDropped += b.Dropped["udp"].Packets
		}
	}
	for phase, labels := range want {
		for _, l := range labels {
			if !slices.Contains(got[phase], l) {
				t.Errorf("%s: %s phase: the sidecar did not record %q as blocked; it recorded %v", task, phase, l, got[phase])
			}
		}
	}
	// A switch ends demo-shared's run phase, the environment's close demo-fresh's: the
	// record holds the drops either way.
	if runDropped == 0 {
		t.Errorf("%s: run phase: no UDP datagram counted as dropped by the transparent path", task)
	}
}
