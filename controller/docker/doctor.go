package docker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"golang.org/x/sys/unix"
)

// Finding is one doctor check: what was checked, whether it passed, and the fix.
type Finding struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Doctor checks what the provider needs from this host. It changes nothing (the
// transparent path's check builds one between two throw-away namespaces, then removes it).
func (p *Provider) Doctor(ctx context.Context) []Finding {
	var out []Finding
	add := func(check string, ok bool, detail, fix string) {
		f := Finding{Check: check, OK: ok, Detail: detail}
		if !ok {
			f.Fix = fix
		}
		out = append(out, f)
	}
	v, err := p.api.ServerVersion(ctx)
	if err != nil {
		add("docker reachable", false, err.Error(), "start the Docker daemon, or point DOCKER_HOST at it; the controller needs access to its socket (root or the docker group)")
		return out
	}
	add("docker reachable", true, fmt.Sprintf("Engine %s, API %s (minimum %s)", v.Version, v.APIVersion, v.MinAPIVersion), "")
	add("engine API version", apiAtLeast(v.APIVersion, 1, 41), "API "+v.APIVersion+"; 1.41 (Docker 20.10) or later is supported",
		"upgrade Docker Engine to 20.10 or later")

	info, err := p.api.Info(ctx)
	if err != nil {
		add("bridge driver", false, err.Error(), "check the Docker daemon's health (docker info)")
	} else {
		bridge := false
		for _, d := range info.Plugins.Network {
			bridge = bridge || d == "bridge"
		}
		add("bridge driver", bridge, "network drivers: "+strings.Join(info.Plugins.Network, ", "), "the bridge network driver is required; check the daemon's configuration (e.g. \"bridge\": \"none\" in daemon.json disables only the default bridge, which is fine)")
	}

	for _, img := range []struct{ tag, what, fix string }{
		{p.cfg.ProxyImage, "proxy image", "run `compassctl env image build` (needs the compass-proxy binary), or `compassctl env image load FILE` on an air-gapped host"},
		{p.cfg.ProbeImage, "probe image (verify)", "run `compassctl env image build --probe` (needs the probe binary), or `image load FILE`"},
	} {
		_, err := p.api.ImageInspect(ctx, img.tag)
		switch {
		case err == nil:
			add(img.what, true, img.tag+" present", "")
		case cerrdefs.IsNotFound(err):
			add(img.what, false, img.tag+" missing", img.fix)
		default:
			add(img.what, false, err.Error(), img.fix)
		}
	}

	p.checkNamespaceAccess(ctx, add)
	if err := p.link.SelfTest(); err != nil {
		add("transparent path", false, err.Error(), "run the controller as root on a kernel with veth and nf_tables (nft_fib, nft_nat, nft_redir, nft_counter; e.g. modprobe nft_fib_inet nft_nat)")
	} else {
		add("transparent path", true, "built, checked and removed a veth link and the nftables table between two throw-away namespaces", "")
	}

	if free, total, err := p.PoolUsage(ctx); err != nil {
		add("address pool", false, err.Error(), "check the Docker daemon's health")
	} else {
		add("address pool", free > 0, fmt.Sprintf("%d of %d /%d subnets free in %s", free, total, p.cfg.SubnetBits, p.cfg.Pool),
			"close unused environments (compassctl env ls), or give a wider --pool; make sure no other network uses the range")
	}

	p.checkEgressNetwork(ctx, bridgeNetFilter(), add)

	ok, detail := stateDirUsable(p.cfg.StateDir)
	add("state directory", ok, detail, "create "+p.cfg.StateDir+" writable by the controller, or pass --state-dir / COMPASS_STATE_DIR")
	return out
}

// stateDirUsable says whether the controller can keep its state in dir, without creating
// it (doctor changes nothing): dir writable, or absent under a writable ancestor, which
// the first open then creates it in.
func stateDirUsable(dir string) (bool, string) {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return false, dir + " is not a directory"
	case err == nil:
		if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
			return false, dir + " not writable: " + err.Error()
		}
		return true, dir + " writable"
	case !errors.Is(err, fs.ErrNotExist):
		return false, err.Error()
	}
	for parent := filepath.Dir(dir); ; parent = filepath.Dir(parent) {
		fi, err := os.Stat(parent)
		if err == nil && fi.IsDir() {
			if err := unix.Access(parent, unix.W_OK|unix.X_OK); err != nil {
				return false, dir + " absent, and " + parent + " not writable to create it in: " + err.Error()
			}
			return true, dir + " absent: the first open creates it in " + parent
		}
		if err == nil || !errors.Is(err, fs.ErrNotExist) || parent == filepath.Dir(parent) {
			return false, dir + " absent, and no directory above it to create it in"
		}
	}
}

func apiAtLeast(v string, major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(v, "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || (a == major && b >= minor)
}

// checkNamespaceAccess opens the network namespace of a running container, as every
// switch does to edit the agent's routes.
func (p *Provider) checkNamespaceAccess(ctx context.Context, add func(check string, ok bool, detail, fix string)) {
	const fix = "run the controller as root (or with CAP_SYS_ADMIN and CAP_SYS_PTRACE) on the Docker host, in the host PID namespace"
	// The newest running containers, in turn: one may be removed between the list and
	// its inspection (doctor runs beside whatever else uses the engine).
	cs, err := p.api.ContainerList(ctx, container.ListOptions{Limit: 8})
	if err != nil || len(cs) == 0 {
		add("namespace access", true, "not checked: no running container (open one and run doctor again)", "")
		return
	}
	var ci container.InspectResponse
	var name string
	for _, c := range cs {
		if ci, err = p.api.ContainerInspect(ctx, c.ID); err == nil && ci.State != nil && ci.State.Pid != 0 {
			name = c.Names[0]
			break
		}
	}
	if name == "" {
		add("namespace access", true, "not checked: the running containers vanished", "")
		return
	}
	path := fmt.Sprintf("/proc/%d/ns/net", ci.State.Pid)
	f, err := os.Open(path)
	if err != nil {
		add("namespace access", false, err.Error(), fix)
		return
	}
	f.Close()
	if _, err := p.routes.DefaultRoutes(ci.State.Pid); err != nil {
		add("namespace access", false, err.Error(), fix)
		return
	}
	add("namespace access", true, "can read routes in "+path+" (container "+name+")", "")
}

// bridgeNetFilter is net.bridge.bridge-nf-call-iptables as this process sees it (the
// setting is per network namespace), or "absent" before br_netfilter is loaded.
func bridgeNetFilter() string {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	if err != nil {
		return "absent"
	}
	return strings.TrimSpace(string(b))
}

// checkEgressNetwork reports whether the egress network keeps its containers apart, as
// the controller creates it (bridgeICC off). One created otherwise, by hand or by an
// older controller, lets one task's agent reach another's through its sidecar. The
// rule that keeps them apart is an iptables rule, which bridged traffic meets only
// with bridge-nf-call-iptables on (netFilter); Docker turns it on when it creates such
// a network, so it is checked only once the network exists.
func (p *Provider) checkEgressNetwork(ctx context.Context, netFilter string, add func(check string, ok bool, detail, fix string)) {
	name := p.cfg.EgressNetwork
	ni, err := p.api.NetworkInspect(ctx, name, network.InspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		add("egress network", true, name+" absent: the first open creates it with traffic between its containers off", "")
	case err != nil:
		add("egress network", false, err.Error(), "check the Docker daemon's health (docker network inspect "+name+")")
	case iccOn(ni.Options):
		add("egress network", false, name+" lets its containers reach each other: one task's agent can reach another task's through its sidecar",
			"close every environment on it, then docker network rm "+name+": the next open creates it with "+bridgeICC+"=false")
	case netFilter != "1":
		add("egress network", false, name+" keeps its containers apart only with bridge-nf-call-iptables=1, and it is "+netFilter,
			"modprobe br_netfilter && sysctl -w net.bridge.bridge-nf-call-iptables=1")
	default:
		add("egress network", true, name+": traffic between its containers is off", "")
	}
}

// iccOn reports whether a bridge network's options leave traffic between its
// containers on, as Docker reads them (on unless the option parses as false).
func iccOn(options map[string]string) bool {
	v, ok := options[bridgeICC]
	if !ok {
		return true
	}
	on, err := strconv.ParseBool(v)
	return err != nil || on
}
