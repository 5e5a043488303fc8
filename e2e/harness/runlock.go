package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/internal/filelock"
)

// runLockWait bounds how long a run waits for another live run of the same package to
// finish: long enough for one package's e2e tests, short enough to leave the waiting
// run time for its own within go test's 18-minute timeout (Makefile).
const runLockWait = 8 * time.Minute

// runLock makes the runs of one package on this machine take turns. Set-up sweeps every
// object that carries the package's owner label, which is right only for what a
// killed run left, never for what a live run is using; and the kernel drops a flock
// when its holder dies, so a killed run holds no lock and a live one always does. The
// lock file lives in dir beside (not inside) the run's scratch directory, which set-up
// removes. It waits until ctx ends, naming the live run it waits for.
func runLock(ctx context.Context, dir, pkg string) (unlock func(), err error) {
	path := filepath.Join(dir, "compass-e2e-"+pkg+".lock")
	f, err := filelock.Lock(ctx, path, func() {
		fmt.Fprintf(os.Stderr, "e2e %s: waiting for the run of %s to finish (lock %s)\n", pkg, holder(path), path)
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("harness: run lock %s: still held by the run of %s: %w", path, holder(path), err)
	case err != nil:
		return nil, fmt.Errorf("harness: run lock: %w", err)
	}
	// The holder's pid, for the message of a run that waits.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }, nil
}

// holder names the process that wrote the lock file, as far as it says.
func holder(path string) string {
	b, err := os.ReadFile(path)
	if pid := strings.TrimSpace(string(b)); err == nil && pid != "" {
		return "pid " + pid
	}
	return "another process"
}
