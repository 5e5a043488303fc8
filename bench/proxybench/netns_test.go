package proxybench

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nsthread"
)

func TestNetnsOwner(t *testing.T) {
	tests := []struct {
		name    string
		wantPID int
		wantOK  bool
	}{
		{netnsName("agent", 4242), 4242, true},
		{netnsName("sidecar", 1), 1, true},
		{"proxybench-outside-77", 77, true},
		{"proxybench-agent-0", 0, false},
		{"proxybench-agent-007", 0, false}, // not a name netnsName makes
		{"proxybench-agent-x", 0, false},
		{"proxybench-12", 0, false}, // no role
		{"cetest-agent-12-1", 0, false},
		{"agent-12", 0, false},
	}
	for _, tt := range tests {
		pid, ok := netnsOwner(tt.name)
		if pid != tt.wantPID || ok != tt.wantOK {
			t.Errorf("netnsOwner(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.wantPID, tt.wantOK)
		}
	}
}

// A namespace whose run is gone is swept; one of a run still going (this one) is kept.
func TestSweepNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	leftover := netnsName("sweeptest", gone.Process.Pid)
	if err := nsthread.Discarded(func() error {
		h, err := netns.NewNamed(leftover)
		if err == nil {
			h.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	own, err := createNamespace("sweeptest")
	if err != nil {
		t.Fatal(err)
	}
	defer own.delete()

	swept, err := sweepNamespaces()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(swept, leftover) {
		t.Errorf("swept %v, want %s among them", swept, leftover)
	}
	if _, err := os.Stat(filepath.Join(netnsRunDir, leftover)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after the sweep: %v", leftover, err)
	}
	if _, err := os.Stat(filepath.Join(netnsRunDir, own.Name)); err != nil {
		t.Errorf("the sweep took this run's %s: %v", own.Name, err)
	}
}
