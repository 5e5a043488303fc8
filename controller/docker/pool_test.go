package docker

import (
	"context"
	"sync"
	"testing"

	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/policy"
)

// createRecorder keeps the options of every NetworkCreate the fake Docker receives.
type createRecorder struct {
	*fakeDocker
	mu   sync.Mutex
	opts map[string]network.CreateOptions
}

func (c *createRecorder) NetworkCreate(ctx context.Context, name string, o network.CreateOptions) (network.CreateResponse, error) {
	c.mu.Lock()
	c.opts[name] = o
	c.mu.Unlock()
	return c.fakeDocker.NetworkCreate(ctx, name, o)
}

// The task network is internal and its host bridge carries no IPv4 address: with the
// gateway address on the host, a sandbox reaches host services at <gateway>:<port>.
func TestTaskNetworkLeavesHostWithoutGatewayAddress(t *testing.T) {
	r := newRig(t, "t-gw")
	rec := &createRecorder{fakeDocker: r.docker, opts: map[string]network.CreateOptions{}}
	r.p.api = rec
	e := r.open(t, "t-gw", policy.NoNetwork)
	o, ok := rec.opts[e.names.Network]
	if !ok {
		t.Fatalf("no NetworkCreate for %s (created: %v)", e.names.Network, rec.opts)
	}
	if !o.Internal {
		t.Errorf("task network Internal = false, want true")
	}
	if got := o.Options["com.docker.network.bridge.inhibit_ipv4"]; got != "true" {
		t.Errorf("task network option com.docker.network.bridge.inhibit_ipv4 = %q, want \"true\" (options: %v)", got, o.Options)
	}
	if o.IPAM == nil || len(o.IPAM.Config) != 1 || o.IPAM.Config[0].Gateway != e.plan.Gateway.String() {
		t.Errorf("IPAM = %+v, want the plan's gateway %s reserved", o.IPAM, e.plan.Gateway)
	}
}
