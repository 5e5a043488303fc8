package harness

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// lockChildEnv makes the test binary a child that takes the run lock in the directory
// it names, says so, and holds it until killed.
const lockChildEnv = "COMPASS_HARNESS_LOCK_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		if _, err := runLock(context.Background(), dir, "pkg"); err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("locked\n")
		select {}
	}
	os.Exit(m.Run())
}

// tryLock takes the lock unless someone holds it; the short wait only bounds how long
// a held lock is retried, and the verdict never depends on it.
func tryLock(t *testing.T, dir string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	return runLock(ctx, dir, "pkg")
}

func TestRunLockMakesLiveRunsTakeTurns(t *testing.T) {
	dir := t.TempDir()
	unlock, err := tryLock(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tryLock(t, dir); err == nil {
		t.Fatal("a second run took the lock while the first held it")
	} else if want := "pid " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the live run (%s)", err, want)
	}
	unlock()
	unlock() // Setup's error path and Teardown may both end the turn
	again, err := tryLock(t, dir)
	if err != nil {
		t.Fatalf("the lock was not free after the first run ended: %v", err)
	}
	again()
}

// A run killed while holding the lock must not keep the next run from sweeping what it
// left: the kernel drops the lock with the process.
func TestRunLockFreedByAKilledRun(t *testing.T) {
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), lockChildEnv+"="+dir)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	if _, err := tryLock(t, dir); err == nil {
		t.Fatal("took the lock while the child held it")
	} else if want := "pid " + strconv.Itoa(child.Process.Pid); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the child (%s)", err, want)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	unlock, err := tryLock(t, dir)
	if err != nil {
		t.Fatalf("the killed run still holds the lock: %v", err)
	}
	unlock()
}
