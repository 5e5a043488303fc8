package docker

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// A pid in the controller's own namespace (a reused pid of a host process) is refused
// before anything is read or changed. Only the read is tried: were the guard missing,
// a removal or an addition would edit this host's routes.
func TestRoutesRefuseOwnNamespace(t *testing.T) {
	got, err := netlinkRoutes{}.DefaultRoutes(os.Getpid())
	if err == nil || !strings.Contains(err.Error(), "own network namespace") {
		t.Fatalf("DefaultRoutes(own pid) = %v, %v; want a refusal naming the controller's own namespace", got, err)
	}
}

// Another namespace is not refused: a child in a fresh network namespace (root only)
// has its (empty) default routes read.
func TestRoutesReadOtherNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	cmd := exec.Command(sleep, "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a new network namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for range 50 {
		got, err := netlinkRoutes{}.DefaultRoutes(cmd.Process.Pid)
		if err != nil || len(got) != 0 {
			t.Fatalf("DefaultRoutes(pid in a fresh namespace) = %v, %v; want none and no error", got, err)
		}
	}
	// No thread of this process was left in the child's namespace.
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net"); err == nil && ns != own {
			t.Errorf("thread %s is in %s, not in the process's %s", task.Name(), ns, own)
		}
	}
}
