// Package harness runs end-to-end tests against the real Docker Engine. One Harness per
// test package: it builds the static binaries and the FROM-scratch images (compass-proxy,
// the probe, the fake internet), creates an egress network with the fake internet on it,
// names everything uniquely, labels everything with the package's own owner label, and
// removes what it made, including what a killed earlier run of the same package left.
// Runs of one package on a machine take turns (runLock), so that sweep never removes
// what a live run is using.
//
// Use it from TestMain:
//
//	var h *harness.Harness
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m, "mypkg", &h)) }
//
//	func TestX(t *testing.T) {
//		h.Need(t)                          // skip (or fail under CI) without Docker
//		p := h.Provider(t)                 // a docker.Provider owned by this package
//		e := h.Open(t, p, "x", policy.NoNetwork) // closed at the end of the test
//		...
//	}
//
// Fake internet: every name under .test resolves (through the sidecar's upstream) to
// the fakenet container, which serves HTTP on :80, HTTPS on :443 (self-signed) and
// /stream (a line every 100 ms). h.Fakenet is its address: an "outside" address for
// direct-egress checks.
package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"

	"github.com/compass-egress/compass-egress/controller/docker"
)

// OwnerLabel is the label key every object of a controller carries; the harness uses
// the value "e2e-<package>" so that parallel test packages never touch each other's.
const OwnerLabel = "compass-egress.owner"

// Harness is one test package's Docker world.
type Harness struct {
	Docker   *client.Client
	Owner    string // owner label value: "e2e-<package>"
	Prefix   string // prefix of every object name made by this run
	BinDir   string // compass-proxy, compassctl, probe, fakenet, goclient (static)
	StateDir string // provider state directory of this run

	ProxyImage, ProbeImage, FakenetImage string

	// busyboxImage and clientsImage are built on first use (ClientsImage).
	busyboxImage, clientsImage string
	clientsOnce                sync.Once
	clientsErr                 error

	EgressNetwork string
	EgressSubnet  netip.Prefix
	Fakenet       netip.Addr // the fake internet's address on the egress network

	// stuck are networks of this package that the engine would not remove (a stale
	// endpoint count, see removeNetwork), by name.
	stuck []string

	skipReason string
	short      bool
	unlock     func() // ends this run's turn (runLock)
}

// Main runs the package's tests with a harness in *h, and tears it down afterwards. If
// Docker is unreachable, every test calling Need fails when CI is set and is skipped
// with a loud message otherwise. With -short (make unit) or -list nothing is set up and
// every test calling Need is skipped.
func Main(m *testing.M, pkg string, h **Harness) int {
	flag.Parse()
	if testing.Short() {
		*h = &Harness{skipReason: "-short runs no e2e tests", short: true}
		return m.Run()
	}
	// Listing the tests runs none: it must not build images or remove what another
	// run of the package is using.
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		*h = &Harness{skipReason: "-list runs no tests", short: true}
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	hh, err := Setup(ctx, pkg)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\n*** e2e %s: Docker environment unavailable: %v ***\n\n", pkg, err)
		hh = &Harness{skipReason: err.Error()}
	}
	*h = hh
	code := m.Run()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if terr := hh.Teardown(ctx); terr != nil {
			fmt.Fprintf(os.Stderr, "e2e %s: teardown: %v\n", pkg, terr)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Need stops the test when the harness could not be set up: a failure under CI (where
// Docker must be there), a skip elsewhere.
func (h *Harness) Need(t testing.TB) {
	t.Helper()
	if h == nil || h.skipReason == "" {
		return
	}
	if os.Getenv("CI") != "" && !h.short {
		t.Fatalf("e2e needs Docker (CI is set): %s", h.skipReason)
	}
	t.Skipf("SKIPPING e2e, Docker unavailable: %s", h.skipReason)
}

// Setup waits for any live run of pkg to finish, builds binaries and images, removes
// leftovers of earlier runs of pkg, and starts the egress network and the fake internet.
func Setup(ctx context.Context, pkg string) (_ *Harness, err error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("harness: docker client: %w", err)
	}
	if _, err := cli.Ping(ctx); err != nil {
		cli.Close()
		return nil, fmt.Errorf("harness: docker not reachable: %w", err)
	}
	waitCtx, cancel := context.WithTimeout(context.Background(), runLockWait)
	unlock, err := runLock(waitCtx, os.TempDir(), pkg)
	cancel()
	if err != nil {
		cli.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	h := &Harness{
		Docker: cli,
		Owner:  "e2e-" + pkg,
		Prefix: fmt.Sprintf("ce2e-%s-%d", pkg, os.Getpid()%100000),
		unlock: unlock,
	}
	h.ProxyImage = "compass-e2e-proxy:" + pkg
	h.ProbeImage = "compass-e2e-probe:" + pkg
	h.FakenetImage = "compass-e2e-fakenet:" + pkg
	h.busyboxImage = "compass-e2e-busybox:" + pkg
	h.clientsImage = "compass-e2e-clients:" + pkg
	if err := h.removeLeftovers(ctx); err != nil {
		return nil, err
	}
	base := filepath.Join(os.TempDir(), "compass-e2e-"+pkg)
	if err := os.RemoveAll(base); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	h.BinDir = filepath.Join(base, "bin")
	h.StateDir = filepath.Join(base, "state")
	if err := os.MkdirAll(h.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	start := time.Now()
	if err := h.buildBinaries(ctx); err != nil {
		return nil, err
	}
	built := time.Now()
	if err := h.buildImages(ctx); err != nil {
		return nil, err
	}
	imaged := time.Now()
	if err := h.startFakeInternet(ctx); err != nil {
		_ = h.Teardown(context.WithoutCancel(ctx))
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "e2e %s: binaries %s, images %s, fake internet %s\n", pkg,
		built.Sub(start).Round(time.Millisecond), imaged.Sub(built).Round(time.Millisecond), time.Since(imaged).Round(time.Millisecond))
	return h, nil
}

// ModuleRoot finds the directory of go.mod above the working directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("harness: go.mod not found")
		}
		dir = parent
	}
}

// GoTool is the go command to build with: $GO, or go from PATH.
func GoTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

func (h *Harness) buildBinaries(ctx context.Context) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, GoTool(), "build", "-trimpath", "-o", h.BinDir+string(os.PathSeparator),
		"./cmd/compass-proxy", "./cmd/compassctl", "./images/probe", "./images/fakenet", "./images/goclient")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go build: %w\n%s", err, out)
	}
	return nil
}

func (h *Harness) buildImages(ctx context.Context) error {
	specs := []docker.ImageSpec{
		docker.ProxyImageSpec(h.ProxyImage, filepath.Join(h.BinDir, "compass-proxy")),
		docker.ProbeImageSpec(h.ProbeImage, filepath.Join(h.BinDir, "probe")),
		{Tag: h.FakenetImage, Binary: filepath.Join(h.BinDir, "fakenet"), Name: "fakenet"},
	}
	for _, s := range specs {
		if err := docker.BuildImage(ctx, h.Docker, s); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	return nil
}

func (h *Harness) labels() map[string]string {
	return map[string]string{OwnerLabel: h.Owner, "compass-egress.managed": "true"}
}

func (h *Harness) startFakeInternet(ctx context.Context) error {
	h.EgressNetwork = h.Prefix + "-egress"
	// An earlier run's egress network that the engine keeps is taken over rather than
	// left beside a new one: Engine 20.10 left a stale count on it after 4 of 7 runs of
	// the 50-environment scale test, and each run would hold one more subnet of the
	// engine's default pools until they ran out. Its stale count harms nothing else.
	if i := slices.IndexFunc(h.stuck, h.isEgressNetworkName); i >= 0 {
		h.EgressNetwork = h.stuck[i]
		fmt.Fprintf(os.Stderr, "*** e2e: taking over network %s as this run's egress network ***\n", h.EgressNetwork)
	} else if _, err := h.Docker.NetworkCreate(ctx, h.EgressNetwork, network.CreateOptions{Driver: "bridge", Labels: h.labels()}); err != nil {
		return fmt.Errorf("harness: create egress network: %w", err)
	}
	ni, err := h.Docker.NetworkInspect(ctx, h.EgressNetwork, network.InspectOptions{})
	if err != nil || len(ni.IPAM.Config) == 0 {
		return fmt.Errorf("harness: inspect egress network: %v", err)
	}
	if h.EgressSubnet, err = netip.ParsePrefix(ni.IPAM.Config[0].Subnet); err != nil {
		return fmt.Errorf("harness: egress subnet: %w", err)
	}
	name := h.Prefix + "-fakenet"
	if _, err := h.Docker.ContainerCreate(ctx, &container.Config{Image: h.FakenetImage, Labels: h.labels()},
		&container.HostConfig{NetworkMode: container.NetworkMode(h.EgressNetwork)}, nil, nil, name); err != nil {
		return fmt.Errorf("harness: create fakenet: %w", err)
	}
	if err := h.Docker.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
		return fmt.Errorf("harness: start fakenet: %w", err)
	}
	ci, err := h.Docker.ContainerInspect(ctx, name)
	if err != nil {
		return fmt.Errorf("harness: inspect fakenet: %w", err)
	}
	ep := ci.NetworkSettings.Networks[h.EgressNetwork]
	if ep == nil {
		return errors.New("harness: fakenet is not on the egress network")
	}
	if h.Fakenet, err = netip.ParseAddr(ep.IPAddress); err != nil {
		return fmt.Errorf("harness: fakenet address: %w", err)
	}
	return nil
}

// isEgressNetworkName reports whether name is what startFakeInternet names a run's
// egress network ("ce2e-<package>-<pid>-egress"), not a network a test made.
func (h *Harness) isEgressNetworkName(name string) bool {
	rest, ok := strings.CutPrefix(name, "ce2e-"+strings.TrimPrefix(h.Owner, "e2e-")+"-")
	if !ok {
		return false
	}
	pid, ok := strings.CutSuffix(rest, "-egress")
	if !ok {
		return false
	}
	_, err := strconv.Atoi(pid)
	return err == nil
}

// removeLeftovers deletes every container and network carrying this package's owner
// label: what a killed earlier run left behind.
func (h *Harness) removeLeftovers(ctx context.Context) error {
	f := filters.NewArgs(filters.Arg("label", OwnerLabel+"="+h.Owner))
	cs, err := h.Docker.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("harness: list containers: %w", err)
	}
	var errs []error
	for _, c := range cs {
		if err := h.Docker.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
			errs = append(errs, err)
		}
	}
	ns, err := h.Docker.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return fmt.Errorf("harness: list networks: %w", err)
	}
	for _, n := range ns {
		if err := h.removeNetwork(ctx, n.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("harness: remove leftovers: %w", err)
	}
	return nil
}

// removeNetwork removes a network, retrying for a few seconds: Docker may still be
// releasing the endpoints of containers removed a moment ago ("has active
// endpoints"). Between tries it force-disconnects whatever the network still lists.
// A network that lists no container and still has an endpoint holds a stale one that
// Engine 20.10 sometimes keeps until it restarts: it is reported and left (nothing can
// remove it), and an egress network among them is the next run's (startFakeInternet).
func (h *Harness) removeNetwork(ctx context.Context, id string) error {
	var err error
	for try := 0; try < 30; try++ {
		if err = h.Docker.NetworkRemove(ctx, id); err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		ni, ierr := h.Docker.NetworkInspect(ctx, id, network.InspectOptions{})
		if ierr == nil {
			// By name: for an endpoint whose container is gone (listed as "ep-<ID>"),
			// only the container's name finds it.
			for _, ep := range ni.Containers {
				_ = h.Docker.NetworkDisconnect(ctx, id, ep.Name, true)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: remove network %s: %w", id, err)
		case <-time.After(100 * time.Millisecond):
		}
		if try == 29 && ierr == nil && len(ni.Containers) == 0 && strings.Contains(err.Error(), "active endpoints") {
			fmt.Fprintf(os.Stderr, "*** e2e: network %s (%s) keeps a stale endpoint with no container; left in place: %v ***\n", ni.Name, id, err)
			h.stuck = append(h.stuck, ni.Name)
			return nil
		}
	}
	return fmt.Errorf("harness: remove network %s: %w", id, err)
}

// Leftovers lists the containers and networks of this package still present.
func (h *Harness) Leftovers(ctx context.Context) ([]string, error) {
	f := filters.NewArgs(filters.Arg("label", OwnerLabel+"="+h.Owner))
	cs, err := h.Docker.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range cs {
		out = append(out, "container "+strings.Join(c.Names, ","))
	}
	ns, err := h.Docker.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		out = append(out, "network "+n.Name)
	}
	return out, nil
}

// Teardown removes everything this package's runs made: containers, networks, images
// and the state directory.
func (h *Harness) Teardown(ctx context.Context) error {
	errs := []error{h.removeLeftovers(ctx)}
	// The clients image before busybox's, which is its parent.
	for _, img := range []string{h.ProxyImage, h.ProbeImage, h.FakenetImage, h.clientsImage, h.busyboxImage} {
		if _, err := h.Docker.ImageRemove(ctx, img, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil && !strings.Contains(err.Error(), "No such image") {
			errs = append(errs, err)
		}
	}
	errs = append(errs, os.RemoveAll(filepath.Dir(h.StateDir)))
	h.Docker.Close()
	h.unlock()
	return errors.Join(errs...)
}
