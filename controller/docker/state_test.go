package docker

import (
	"os"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
)

// A record cut short (a full disk, a kill mid-write) leaves a fragment without its
// newline; the next record must still be read, not joined to the fragment.
func TestTransitionAfterAFragmentIsRead(t *testing.T) {
	dir := stateDir(t.TempDir())
	if err := os.WriteFile(dir.transitions(), []byte(`{"time":"2026-12-01T10:00:00Z","to_mo`), 0o640); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)
	if err := dir.appendTransition(controller.Transition{Time: at, OK: true}); err != nil {
		t.Fatal(err)
	}
	trs, err := dir.lastTransitions(10)
	if err != nil {
		t.Fatal(err)
	}
	if len(trs) != 1 || !trs[0].Time.Equal(at) {
		t.Errorf("transitions after a fragment: %+v, want the one appended", trs)
	}
}
