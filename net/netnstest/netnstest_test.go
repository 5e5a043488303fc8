package netnstest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netns"
)

func TestLeftoverPID(t *testing.T) {
	tests := []struct {
		name, label string
		pid         int
		ok          bool
	}{
		{"cetest-link-123-4", "link", 123, true},
		{"cetest-link-123-4", "nft", 0, false},
		{"cetest-linkx-123-4", "link", 0, false},
		{"cetest-link-abc-4", "link", 0, false},
		{"cetest-link-123", "link", 0, false},
		{"cetest-link-0-1", "link", 0, false},
		{"other", "link", 0, false},
	}
	for _, tt := range tests {
		pid, ok := leftoverPID(tt.name, tt.label)
		if pid != tt.pid || ok != tt.ok {
			t.Errorf("leftoverPID(%q, %q) = %d, %v; want %d, %v", tt.name, tt.label, pid, ok, tt.pid, tt.ok)
		}
	}
}

// TestNewSweepsLeftovers: a namespace left by a process that no longer runs
// is deleted by the next New of the same label; one of another label is not.
func TestNewSweepsLeftovers(t *testing.T) {
	RequireRoot(t)
	const deadPID = 0x7ffffff0 // above any pid_max
	leftover := fmt.Sprintf("%ssweep-%d-1", prefix, deadPID)
	other := fmt.Sprintf("%ssweepx-%d-1", prefix, deadPID)
	for _, name := range []string{leftover, other} {
		h, err := newNamed(name)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	t.Cleanup(func() { _ = netns.DeleteNamed(other) })
	New(t, "sweep")
	if _, err := os.Stat(filepath.Join(runDir, leftover)); err == nil {
		t.Errorf("leftover %s survived New", leftover)
	}
	if _, err := os.Stat(filepath.Join(runDir, other)); err != nil {
		t.Errorf("namespace %s of another label was swept: %v", other, err)
	}
}
