package controller_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/internal/testutil"
)

func TestLogProgress(t *testing.T) {
	var out testutil.SyncBuffer
	p := controllertest.New()
	r := newRunner(t, p)
	r.Progress = controller.NewLogProgress(&out)
	tr := task(t, controller.EvaluationShared)
	tr.Run = []controller.Command{{"blocked", "2"}}
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
	lp.Update(controller.ProgressUpdate{Task: "a", Step: controller.StepRun, Mode: "no-network", Started: time.Now(), Blocked: 1})
	lp.Update(controller.ProgressUpdate{Task: "b", Step: controller.StepPrepare, Mode: "public", Started: time.Now()})
	start := time.Now().Add(-time.Hour)
	lp.Update(controller.ProgressUpdate{Task: "c", Step: controller.StepClose, Started: start, Done: true,
		Ended: start.Add(90 * time.Second), Status: controller.StatusSucceeded})
	lp.Update(controller.ProgressUpdate{Task: "a", Step: controller.StepEvaluate, Mode: "allowlist", Started: time.Now(), Blocked: 3})
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
