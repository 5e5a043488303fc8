package filelock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// A held lock makes a second Lock say so once and give up with its context; closing
// the holder's file frees it.
func TestLockWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	held, err := Lock(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	busy := 0
	// The short context only bounds how long a held lock is retried; the verdict never
	// depends on it.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if f, err := Lock(ctx, path, func() { busy++ }); !errors.Is(err, context.DeadlineExceeded) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("second Lock while held: %v, want the context's deadline", err)
	}
	if busy != 1 {
		t.Errorf("busy called %d times, want once", busy)
	}
	held.Close()
	again, err := Lock(context.Background(), path, func() { t.Error("busy called for a free lock") })
	if err != nil {
		t.Fatalf("Lock after the holder closed: %v", err)
	}
	again.Close()
}

func TestLockReportsAnUnusablePath(t *testing.T) {
	if _, err := Lock(context.Background(), filepath.Join(t.TempDir(), "missing", "lock"), nil); err == nil {
		t.Fatal("Lock in a missing directory succeeded")
	}
}
