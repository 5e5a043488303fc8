// Package filelock takes exclusive advisory locks on files, giving up when a context ends:
// a blocking flock(2) would outlast every deadline while another process holds the lock.
// The kernel drops a lock when its holder dies, so a crashed holder never keeps it.
package filelock

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// retry is how often a held lock is tried again.
const retry = 10 * time.Millisecond

// Lock takes an exclusive lock on path (created 0600 if absent) and returns the open
// file that holds it: closing the file releases the lock. While another process holds
// it, busy (if not nil) is called once and the lock is tried again until ctx ends, when
// Lock returns ctx's error.
func Lock(ctx context.Context, path string, busy func()) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, &os.PathError{Op: "flock", Path: path, Err: err}
		}
		if busy != nil {
			busy()
			busy = nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(retry):
		}
	}
}
