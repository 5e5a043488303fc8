package dockerenv

import (
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
)

// A live swap re-decides the agent's transparent connections and cuts those the new
// policy refuses: an SSH-like session with git.test:22 (chatting, so the idle bound
// does not end it) ends when git.test:22 leaves the allowlist, while a stream from
// packages.test, still allowed, keeps coming.
func testSwapCuts(t *testing.T, w *clientsWorld) {
	ctx := timeout(t, time.Minute)
	w.background(t, "(while :; do echo ping; sleep 0.2; done) | nc git.test 22 >/tmp/git.out 2>&1; echo ended >/tmp/git.done")
	w.background(t, "wget -q -O /tmp/stream.out http://packages.test/stream")
	if !w.fileHas(t, "/tmp/git.out", 10*time.Second, "SSH-2.0-fakenet", "ping") || !w.fileHas(t, "/tmp/stream.out", 10*time.Second, "line 1 ") {
		t.Fatal("the sessions did not start")
	}
	if out := w.sh(t, "test -e /tmp/git.done"); out != "exit=1\n" {
		t.Fatalf("the git.test:22 session ended before the swap: %q", out)
	}
	narrowed := mustParse(`{"network_mode":"allowlist","allowed_hosts":["model.test:443","packages.test:80"]}`)
	rep, err := w.e.Switch(ctx, narrowed, controller.PhaseLabel{Phase: "narrowed"})
	if err != nil {
		t.Fatalf("switch: %v", err)
	}
	t.Logf("switch: %v parts %v changes %q", rep.Duration, rep.Parts, rep.Changes)
	if !w.fileHas(t, "/tmp/git.done", 5*time.Second, "ended") {
		t.Errorf("the git.test:22 session outlived the swap that refused it")
	}
	lines := func() int { return strings.Count(shIn(t, w.e.AgentContainer(), "cat /tmp/stream.out"), "\n") }
	n := lines()
	time.Sleep(time.Second)
	if m := lines(); m <= n {
		t.Errorf("the packages.test stream stopped at the swap: %d lines, then %d a second later", n, m)
	}
}
