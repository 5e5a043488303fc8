package docker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

// TestCheckTask: a task compassctl run cannot drive on Docker is refused before any task
// starts, with the runner's own requirements and the plan's problems.
func TestCheckTask(t *testing.T) {
	tests := []struct {
		name, doc, network, want string
	}{
		{"runnable", "task_id: a\nimage: i\nrun: [x]\n", "", ""},
		{"bridge", "task_id: a\nimage: i\nrun: [x]\n", "bridge", ""},
		{"the runner's own", "task_id: a\nrun: [x]\n", "", `task "a": image: is required`},
		{"other provider", "task_id: a\nprovider: modal\nimage: i\nrun: [x]\n", "", `task "a": provider: "modal": compassctl run drives the docker provider only`},
		// The planner takes 64 characters; Docker names take 63, and the open that refused
		// it came after other tasks of the run had started.
		{"task ID too long for docker", "task_id: " + strings.Repeat("t", 64) + "\nimage: i\nrun: [x]\n", "", "task_id: docker: task ID"},
		// A network asked for through --env-params is refused rather than silently
		// replaced by the task's own internal network.
		{"other network", "task_id: a\nimage: i\nrun: [x]\n", "my-custom-net", `network: "my-custom-net": compassctl run puts every task on its own internal bridge network`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "task.yaml")
			if err := os.WriteFile(file, []byte(tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			tasks, err := policy.LoadTasks(file)
			if err != nil {
				t.Fatal(err)
			}
			pl := policy.Planner{Check: CheckTask, Override: policy.EnvParams{Network: tc.network}}
			_, err = pl.Plan(tasks[0])
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
