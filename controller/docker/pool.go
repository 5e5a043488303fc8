package docker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"

	"github.com/docker/docker/api/types/network"
)

// subnetPlan is the fixed address layout of one per-task network.
type subnetPlan struct {
	Subnet  netip.Prefix
	Gateway netip.Addr // first host: reserved in Docker's IPAM, on no interface (see taskNetworkOptions)
	Sidecar netip.Addr // second host
	Agent   netip.Addr // third host
}

func planFor(subnet netip.Prefix) subnetPlan {
	gw := subnet.Addr().Next()
	sc := gw.Next()
	return subnetPlan{Subnet: subnet, Gateway: gw, Sidecar: sc, Agent: sc.Next()}
}

// ErrPoolExhausted means every subnet of the pool is taken.
var ErrPoolExhausted = errors.New("docker: address pool exhausted")

// freeSubnets lists the subnets of size bits inside pool that overlap none of used,
// starting at a random slot so that concurrent opens rarely race for the same one.
func freeSubnets(pool netip.Prefix, bits int, used []netip.Prefix, rnd func(n int) int) []netip.Prefix {
	count := 1 << (bits - pool.Bits())
	start := rnd(count)
	var out []netip.Prefix
	for i := 0; i < count; i++ {
		p := nthSubnet(pool, bits, (start+i)%count)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			out = append(out, p)
		}
	}
	return out
}

func nthSubnet(pool netip.Prefix, bits, n int) netip.Prefix {
	base := pool.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(n) << (32 - bits)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), bits)
}

// usedSubnets collects every IPv4 subnet of every Docker network on the host.
func usedSubnets(ctx context.Context, api dockerAPI) ([]netip.Prefix, error) {
	nets, err := api.NetworkList(ctx, network.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("docker: list networks: %w", err)
	}
	var out []netip.Prefix
	for _, n := range nets {
		for _, c := range n.IPAM.Config {
			if p, err := netip.ParsePrefix(c.Subnet); err == nil {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// isOverlapError reports Docker's refusal of a subnet another network already holds.
func isOverlapError(err error) bool {
	s := err.Error()
	return strings.Contains(s, "overlaps") || strings.Contains(s, "Pool overlaps")
}

// taskNetworkOptions are the bridge driver options of every task network.
// inhibit_ipv4 leaves the host's bridge without the gateway address: Docker's isolation
// rules only filter forwarded traffic, so with the address a sandbox could reach any host
// service listening on 0.0.0.0 at <gateway>:<port>, past the sidecar (moby#47356). Nothing
// needs the address: the agent and the sidecar talk directly on the task network, and
// internal networks have no default route through it.
var taskNetworkOptions = map[string]string{"com.docker.network.bridge.inhibit_ipv4": "true"}

// createTaskNetwork creates the internal network on a free subnet of the pool, retrying
// on the overlap error a concurrent open causes.
func (p *Provider) createTaskNetwork(ctx context.Context, n names, labels map[string]string) (subnetPlan, error) {
	const attempts = 16
	var lastErr error
	for try := 0; try < attempts; try++ {
		used, err := usedSubnets(ctx, p.api)
		if err != nil {
			return subnetPlan{}, err
		}
		free := freeSubnets(p.cfg.Pool, p.cfg.SubnetBits, used, rand.IntN)
		if len(free) == 0 {
			return subnetPlan{}, fmt.Errorf("%w: no free /%d left in %s; close environments or widen --pool", ErrPoolExhausted, p.cfg.SubnetBits, p.cfg.Pool)
		}
		plan := planFor(free[0])
		_, err = p.api.NetworkCreate(ctx, n.Network, network.CreateOptions{
			Driver:   "bridge",
			Internal: true,
			Options:  taskNetworkOptions,
			IPAM: &network.IPAM{Config: []network.IPAMConfig{{
				Subnet:  plan.Subnet.String(),
				Gateway: plan.Gateway.String(),
			}}},
			Labels: labels,
		})
		if err == nil {
			return plan, nil
		}
		if !isOverlapError(err) {
			return subnetPlan{}, fmt.Errorf("docker: create network %s: %w", n.Network, err)
		}
		lastErr = err
	}
	return subnetPlan{}, fmt.Errorf("docker: create network %s: no free subnet after %d attempts: %w", n.Network, attempts, lastErr)
}

// PoolUsage reports how many subnets of the pool are free and how many exist.
func (p *Provider) PoolUsage(ctx context.Context) (free, total int, err error) {
	used, err := usedSubnets(ctx, p.api)
	if err != nil {
		return 0, 0, err
	}
	return len(freeSubnets(p.cfg.Pool, p.cfg.SubnetBits, used, func(int) int { return 0 })), 1 << (p.cfg.SubnetBits - p.cfg.Pool.Bits()), nil
}
