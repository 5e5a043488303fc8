package docker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
)

// ErrStaleEndpointCount is the engine refusing to remove a task network for active
// endpoints while it lists none: Docker Engine keeps such a count until dockerd
// restarts (moby/moby#42119), and no API call clears it.
var ErrStaleEndpointCount = errors.New("the engine counts an endpoint on it that no container holds (a stale count Docker Engine keeps until dockerd restarts, moby/moby#42119); every container of the environment is gone: restart dockerd, then close again")

// removeContainer force-removes a container (gone already is done). Two refusals pass
// once the engine has finished something else, so they are retried for about three
// seconds: "unable to remove filesystem" (the engine found a file written into the
// container's directory while it deleted it, and left the container dead; the next
// removal succeeds) and "already in progress" (another caller's removal, after which the
// container is gone).
func (p *Provider) removeContainer(ctx context.Context, ref string) error {
	var err error
	for try := 1; try <= 5; try++ {
		err = p.api.ContainerRemove(ctx, ref, container.RemoveOptions{Force: true})
		if err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		if !containsAny(err.Error(), "unable to remove filesystem", "already in progress") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try) * 200 * time.Millisecond):
		}
	}
	return err
}

// removeNetwork removes the task network, retrying for about two seconds: Docker may
// still be releasing the endpoints of containers removed a moment ago. It then says
// what keeps the network: a container still attached, or a stale endpoint count.
func (e *Env) removeNetwork(ctx context.Context) error {
	var err error
	for try := 0; try < 20; try++ {
		err = e.p.api.NetworkRemove(ctx, e.names.Network)
		if err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		if isActiveEndpoints(err) {
			e.dropOrphanEndpoints(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("docker: remove network %s: %w", e.names.Network, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !isActiveEndpoints(err) {
		return fmt.Errorf("docker: remove network %s: %w", e.names.Network, err)
	}
	ni, ierr := e.p.api.NetworkInspect(ctx, e.names.Network, network.InspectOptions{})
	switch {
	case ierr != nil:
		return fmt.Errorf("docker: remove network %s: %w", e.names.Network, err)
	case len(ni.Containers) == 0:
		return fmt.Errorf("docker: remove network %s: %w (%v)", e.names.Network, ErrStaleEndpointCount, err)
	}
	var held []string
	for _, ep := range ni.Containers {
		held = append(held, ep.Name)
	}
	slices.Sort(held)
	return fmt.Errorf("docker: remove network %s: still attached: %s (connected by hand: close removes only what open or attach made): %w", e.names.Network, strings.Join(held, ", "), err)
}

// dropOrphanEndpoints force-disconnects the endpoints of the task network that no
// container holds any more (the engine lists them as "ep-<endpoint ID>"): the engine
// left them when it removed their container, and they would keep the network forever.
// The network is this environment's own, and a live container is never touched.
func (e *Env) dropOrphanEndpoints(ctx context.Context) {
	ni, err := e.p.api.NetworkInspect(ctx, e.names.Network, network.InspectOptions{})
	if err != nil {
		return
	}
	for key, ep := range ni.Containers {
		if !strings.HasPrefix(key, "ep-") || ep.Name == "" {
			continue
		}
		// By name: for a container that no longer exists, the engine deletes the
		// network's endpoint of that name.
		if err := e.p.api.NetworkDisconnect(ctx, e.names.Network, ep.Name, true); err != nil {
			e.p.log.Warn("could not drop an orphaned endpoint", "network", e.names.Network, "endpoint", key, "name", ep.Name, "err", err)
		}
	}
}

func isActiveEndpoints(err error) bool {
	return err != nil && strings.Contains(err.Error(), "active endpoints")
}
