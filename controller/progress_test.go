package controller_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

func TestLogProgress(t *testing.T) {
	var out testutil.SyncBuffer
	p := controllertest.New()
	r := newRunner(t, p)
	r.Progress = controller.NewLogProgress(&out)
	tr := task(t, policy.EvaluationShared)
	tr.Run = []lifecycle.Command{{"blocked", "2"}}
	if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"task=t1 phase=prepare mode=public ",
		"task=t1 phase=run mode=allowlist ",
		"task=t1 phase=evaluate mode=denylist ",
		"task=t1 phase=done: succeeded mode=- ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no line with %q in\n%s", want, text)
		}
	}
	if !strings.Contains(text, "phase=done: succeeded mode=- elapsed=") || !strings.HasSuffix(strings.TrimSpace(text), "blocked=2") {
		t.Errorf("final line should count the 2 blocked attempts:\n%s", text)
	}
}

func TestLiveProgressRedrawsInPlace(t *testing.T) {
	var out testutil.SyncBuffer
	lp := controller.NewLiveProgress(&out, time.Hour)
	lp.Update(controller.ProgressUpdate{Task: "a", Step: lifecycle.StepRun, Mode: "no-network", Started: time.Now(), Blocked: 1})
	lp.Update(controller.ProgressUpdate{Task: "b", Step: lifecycle.StepPrepare, Mode: "public", Started: time.Now()})
	start := time.Now().Add(-time.Hour)
	lp.Update(controller.ProgressUpdate{Task: "c", Step: lifecycle.StepClose, Started: start, Done: true,
		Ended: start.Add(90 * time.Second), Status: controller.StatusSucceeded})
	lp.Update(controller.ProgressUpdate{Task: "a", Step: lifecycle.StepEvaluate, Mode: "allowlist", Started: time.Now(), Blocked: 3})
	lp.Stop()
	text := out.String()
	if !strings.Contains(text, "task=c phase=done: succeeded mode=- elapsed=1m30s") {
		t.Errorf("a finished task's elapsed time should stop at its end: %q", text)
	}
	if strings.Count(text, "\n") != 3 || !strings.Contains(text, "task=a phase=evaluate mode=allowlist") ||
		!strings.Contains(text, "blocked=3") || !strings.Contains(text, "task=b phase=prepare mode=public") {
		t.Errorf("live output %q", text)
	}
}

// TestLogProgressLines: the plain display writes a line when a task's step, mode or
// end state changes, not for every update (the blocked count refreshes every second).
func TestLogProgressLines(t *testing.T) {
	var out testutil.SyncBuffer
	lp := controller.NewLogProgress(&out)
	start := time.Now()
	for _, u := range []controller.ProgressUpdate{
		{Task: "a", Step: lifecycle.StepRun, Mode: "public", Started: start},
		{Task: "a", Step: lifecycle.StepRun, Mode: "public", Started: start, Blocked: 1}, // a poll: no line
		{Task: "b", Step: lifecycle.StepRun, Mode: "public", Started: start},             // another task
		{Task: "a", Step: lifecycle.StepRun, Mode: "no-network", Started: start, Blocked: 1},
		{Task: "a", Step: lifecycle.StepEvaluate, Mode: "no-network", Started: start, Blocked: 1},
		{Task: "a", Step: lifecycle.StepEvaluate, Mode: "no-network", Started: start, Blocked: 1, Done: true, Status: controller.StatusSucceeded},
	} {
		lp.Update(u)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		_, l, _ = strings.Cut(l, " ") // the time
		got = append(got, elapsed.ReplaceAllString(l, ""))
	}
	want := []string{
		"task=a phase=run mode=public blocked=0",
		"task=b phase=run mode=public blocked=0",
		"task=a phase=run mode=no-network blocked=1",
		"task=a phase=evaluate mode=no-network blocked=1",
		"task=a phase=done: succeeded mode=no-network blocked=1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("lines\n got  %q\n want %q", got, want)
	}
}

var elapsed = regexp.MustCompile(` elapsed=\S+`)

// TestLiveProgressMovesUp: each redraw goes back up over the lines the last one drew
// and clears each line before writing it, so the display stays one line per task.
func TestLiveProgressMovesUp(t *testing.T) {
	var out testutil.SyncBuffer
	lp := controller.NewLiveProgress(&out, time.Millisecond)
	defer lp.Stop()
	lp.Update(controller.ProgressUpdate{Task: "a", Step: lifecycle.StepRun, Mode: "no-network", Started: time.Now()})
	lp.Update(controller.ProgressUpdate{Task: "b", Step: lifecycle.StepPrepare, Mode: "public", Started: time.Now()})
	// Wait for a redraw after the first frame with both tasks (bounded: it fails then).
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "\x1b[2A"); {
		if time.Now().After(deadline) {
			t.Fatalf("no redraw went back up over the two lines drawn: %q", out.String())
		}
		time.Sleep(time.Millisecond)
	}
	for _, l := range strings.SplitAfter(out.String(), "\n") {
		if l = strings.TrimPrefix(l, "\x1b[1A"); l != "" && !strings.HasPrefix(strings.TrimPrefix(l, "\x1b[2A"), "\x1b[2K") {
			t.Errorf("line %q is not cleared before it is drawn", l)
		}
	}
}
