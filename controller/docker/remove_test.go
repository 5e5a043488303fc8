package docker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// What keeps a task network after its containers are gone, and what close then does:
// an endpoint whose container is gone is dropped; a count the engine keeps without an
// endpoint, or a container someone attached by hand, is named and left.
func TestCloseOfANetworkTheEngineHoldsOn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hold    func(f *fakeDocker, network string)
		wantErr string // "" for a close that removes everything
		stale   bool
	}{
		{
			name: "endpoint of a removed container",
			hold: func(f *fakeDocker, n string) {
				f.networks[n].orphans = map[string]string{"ep-0123abcd": "compass-agent-gone"}
			},
		},
		{
			name: "count without an endpoint",
			hold: func(f *fakeDocker, n string) {
				f.networks[n].staleCount = 1
			},
			wantErr: "restart dockerd",
			stale:   true,
		},
		{
			name: "container attached by hand",
			hold: func(f *fakeDocker, n string) {
				f.containers["bystander"] = &fakeContainer{id: "c-bystander", networks: map[string]bool{n: true}}
			},
			wantErr: "still attached: bystander",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "held")
			r.open(t, "held", policy.NoNetwork)
			n := namesFor("held")
			r.docker.mu.Lock()
			tc.hold(r.docker, n.Network)
			r.docker.mu.Unlock()
			err := r.p.RemoveTask(context.Background(), "held", lifecycle.RoleAgent)
			left := r.leftovers("held")
			if tc.wantErr == "" {
				if err != nil || len(left) > 0 {
					t.Fatalf("close: %v, left %v; want everything removed", err, left)
				}
				if r.ev.index("drop-endpoint "+n.Network+" ep-0123abcd") < 0 {
					t.Errorf("the orphaned endpoint was not dropped: %v", r.ev.all())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), n.Network) {
				t.Fatalf("close: %v; want an error naming %s and %q", err, n.Network, tc.wantErr)
			}
			if got := errors.Is(err, ErrStaleEndpointCount); got != tc.stale {
				t.Errorf("errors.Is(%v, ErrStaleEndpointCount) = %v, want %v", err, got, tc.stale)
			}
			if !slices.Equal(left, []string{n.Network}) {
				t.Errorf("left %v; want only the network %s", left, n.Network)
			}
			if _, ok := r.docker.containers["bystander"]; ok && !r.docker.containers["bystander"].networks[n.Network] {
				t.Error("a container attached by hand was disconnected")
			}
		})
	}
}

// A removal the engine refuses for a moment (a dead container's directory still being
// written, another caller's removal under way) is tried again; any other refusal, or
// one that persists, is close's error, and the environment stays for a later close.
func TestCloseRetriesARemovalTheEngineRefusesForAMoment(t *testing.T) {
	busy := errors.New("Error response from daemon: unable to remove filesystem for 5a2d: unlinkat /var/lib/docker/containers/5a2d: directory not empty")
	inProgress := errors.New("Error response from daemon: removal of container compass-proxy-rr is already in progress")
	other := errors.New("Error response from daemon: driver failed")
	for _, tc := range []struct {
		name    string
		refuse  []error
		wantErr bool
	}{
		{"filesystem busy once", []error{busy}, false},
		{"removal in progress, then filesystem busy", []error{inProgress, busy}, false},
		{"another error", []error{other}, true},
		{"filesystem busy for good", []error{busy, busy, busy, busy, busy}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "rr")
			r.open(t, "rr", policy.NoNetwork)
			n := namesFor("rr")
			r.docker.mu.Lock()
			r.docker.removeErrs = map[string][]error{n.Sidecar: tc.refuse}
			r.docker.mu.Unlock()
			err := r.p.RemoveTask(context.Background(), "rr", lifecycle.RoleAgent)
			left := r.leftovers("rr")
			if !tc.wantErr {
				if err != nil || len(left) > 0 {
					t.Fatalf("close: %v, left %v; want everything removed", err, left)
				}
				return
			}
			if err == nil || !errors.Is(err, tc.refuse[0]) {
				t.Fatalf("close: %v; want the engine's refusal %q", err, tc.refuse[0])
			}
			if !slices.Contains(left, n.Sidecar) || !slices.Contains(left, n.Network) {
				t.Errorf("left %v; want the sidecar and the task network kept for a later close", left)
			}
		})
	}
}
