package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/net/egresslink"
	"github.com/compass-egress/compass-egress/policy"
)

// events is the ordered log of what the fakes were asked to do.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, fmt.Sprintf(format, args...))
}

func (e *events) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

func (e *events) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = nil
}

// index returns the position of the first event starting with prefix, or -1.
func (e *events) index(prefix string) int {
	for i, s := range e.all() {
		if strings.HasPrefix(s, prefix) {
			return i
		}
	}
	return -1
}

type fakeContainer struct {
	id       string
	running  bool
	pid      int
	labels   map[string]string
	networks map[string]bool
	mode     container.NetworkMode
	capDrop  []string
}

type fakeNetwork struct {
	name     string
	subnet   string
	gateway  string
	internal bool
	labels   map[string]string
	options  map[string]string
	// orphans are endpoints no container holds (by their "ep-" key, to the name of the
	// container that had them), and staleCount endpoints the engine counts but does not
	// list: the two ways Engine 20.10 keeps a network it should let go.
	orphans    map[string]string
	staleCount int
}

// fakeDocker is a tiny in-memory Docker Engine: containers, networks and images by name.
type fakeDocker struct {
	ev         *events
	mu         sync.Mutex
	containers map[string]*fakeContainer
	networks   map[string]*fakeNetwork
	images     map[string]bool
	// overlapOnce makes the first NetworkCreate with a subnet fail like a concurrent open.
	overlapOnce bool
	nextPid     int
	routes      *fakeRoutes
	// disconnectErr makes every disconnect from that network fail (a driver error).
	disconnectErr map[string]error
	// removeErrs are the engine's answers to the next removals of a container, by name,
	// before one succeeds.
	removeErrs map[string][]error
	// inspectErr, when set, may fail an inspect of ref (an engine error).
	inspectErr func(ref string) error
	// execStdout is what an exec prints; with execHang it then runs until cut, and
	// closes execPrinted once the printed bytes were read (the pipe is synchronous).
	execStdout  []byte
	execHang    bool
	execPrinted chan struct{}
}

func newFakeDocker(ev *events) *fakeDocker {
	return &fakeDocker{ev: ev, containers: map[string]*fakeContainer{}, networks: map[string]*fakeNetwork{}, images: map[string]bool{}, nextPid: 100}
}

func notFound(what string) error { return cerrdefs.ErrNotFound.WithMessage(what + " not found") }

func (f *fakeDocker) Ping(context.Context) (types.Ping, error) { return types.Ping{}, nil }
func (f *fakeDocker) ServerVersion(context.Context) (types.Version, error) {
	return types.Version{Version: "20.10.24", APIVersion: "1.41", MinAPIVersion: "1.12"}, nil
}
func (f *fakeDocker) Info(context.Context) (system.Info, error) {
	return system.Info{Plugins: system.PluginsInfo{Network: []string{"bridge", "host", "null"}}}, nil
}

func (f *fakeDocker) ContainerCreate(_ context.Context, cfg *container.Config, hc *container.HostConfig, nc *network.NetworkingConfig, _ *ocispec.Platform, name string) (container.CreateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.containers[name]; ok {
		return container.CreateResponse{}, cerrdefs.ErrConflict.WithMessage("name in use")
	}
	if !f.images[cfg.Image] {
		return container.CreateResponse{}, notFound("image " + cfg.Image)
	}
	c := &fakeContainer{id: "id-" + name, labels: cfg.Labels, networks: map[string]bool{}, mode: hc.NetworkMode, capDrop: hc.CapDrop}
	if !hc.NetworkMode.IsContainer() && !hc.NetworkMode.IsNone() && !hc.NetworkMode.IsHost() {
		c.networks[string(hc.NetworkMode)] = true
	}
	f.containers[name] = c
	f.ev.add("create %s", name)
	return container.CreateResponse{ID: c.id}, nil
}

func (f *fakeDocker) get(ref string) (*fakeContainer, string, error) {
	for name, c := range f.containers {
		if name == ref || c.id == ref {
			return c, name, nil
		}
	}
	return nil, "", notFound("container " + ref)
}

func (f *fakeDocker) ContainerStart(_ context.Context, ref string, _ container.StartOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, name, err := f.get(ref)
	if err != nil {
		return err
	}
	c.running = true
	f.nextPid++
	c.pid = f.nextPid
	f.resetRoutes(c)
	f.ev.add("start %s", name)
	return nil
}

func (f *fakeDocker) ContainerInspect(_ context.Context, ref string) (container.InspectResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inspectErr != nil {
		if err := f.inspectErr(ref); err != nil {
			return container.InspectResponse{}, err
		}
	}
	c, name, err := f.get(ref)
	if err != nil {
		return container.InspectResponse{}, err
	}
	nets := map[string]*network.EndpointSettings{}
	for n := range c.networks {
		nets[n] = &network.EndpointSettings{}
	}
	return container.InspectResponse{
		ContainerJSONBase: &container.ContainerJSONBase{
			ID: c.id, Name: "/" + name,
			State:      &container.State{Running: c.running, Pid: c.pid},
			HostConfig: &container.HostConfig{NetworkMode: c.mode},
		},
		Config:          &container.Config{Labels: c.labels},
		NetworkSettings: &container.NetworkSettings{Networks: nets},
	}, nil
}

func (f *fakeDocker) ContainerList(context.Context, container.ListOptions) ([]container.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []container.Summary
	for name, c := range f.containers {
		if c.labels[labelRole] == roleSidecar {
			out = append(out, container.Summary{ID: c.id, Names: []string{"/" + name}, Labels: c.labels, State: "running"})
		}
	}
	return out, nil
}

func (f *fakeDocker) ContainerStop(_ context.Context, ref string, _ container.StopOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, name, err := f.get(ref)
	if err != nil {
		return err
	}
	c.running = false
	f.ev.add("stop %s", name)
	return nil
}

func (f *fakeDocker) ContainerRemove(_ context.Context, ref string, _ container.RemoveOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, name, err := f.get(ref)
	if err != nil {
		return err
	}
	if errs := f.removeErrs[name]; len(errs) > 0 {
		f.removeErrs[name] = errs[1:]
		f.ev.add("remove-refused %s", name)
		return errs[0]
	}
	delete(f.containers, name)
	f.ev.add("remove %s", name)
	return nil
}

func (f *fakeDocker) ContainerWait(context.Context, string, container.WaitCondition) (<-chan container.WaitResponse, <-chan error) {
	panic("not used")
}
func (f *fakeDocker) ContainerLogs(context.Context, string, container.LogsOptions) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader("")), nil
}
func (f *fakeDocker) ContainerExecCreate(context.Context, string, container.ExecOptions) (container.ExecCreateResponse, error) {
	return container.ExecCreateResponse{ID: "exec-1"}, nil
}

// ContainerExecAttach streams execStdout in Docker's multiplexed framing over an
// in-memory pipe, then ends the stream, or with execHang holds it open until closed.
func (f *fakeDocker) ContainerExecAttach(context.Context, string, container.ExecAttachOptions) (types.HijackedResponse, error) {
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		if _, err := stdcopy.NewStdWriter(server, stdcopy.Stdout).Write(f.execStdout); err != nil {
			return
		}
		if f.execHang {
			close(f.execPrinted)
			_, _ = io.Copy(io.Discard, server) // until the client side is closed
		}
	}()
	return types.NewHijackedResponse(client, ""), nil
}
func (f *fakeDocker) ContainerExecInspect(context.Context, string) (container.ExecInspect, error) {
	return container.ExecInspect{ExitCode: 0}, nil
}
func (f *fakeDocker) CopyFromContainer(context.Context, string, string) (io.ReadCloser, container.PathStat, error) {
	panic("not used")
}
func (f *fakeDocker) CopyToContainer(context.Context, string, string, io.Reader, container.CopyToContainerOptions) error {
	panic("not used")
}

func (f *fakeDocker) NetworkCreate(_ context.Context, name string, o network.CreateOptions) (network.CreateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.networks[name]; ok {
		return network.CreateResponse{}, cerrdefs.ErrConflict.WithMessage("network with name " + name + " already exists")
	}
	n := &fakeNetwork{name: name, internal: o.Internal, labels: o.Labels, options: o.Options, subnet: "172.30.0.0/16", gateway: "172.30.0.1"}
	if o.IPAM != nil && len(o.IPAM.Config) > 0 {
		if f.overlapOnce {
			f.overlapOnce = false
			return network.CreateResponse{}, errors.New("Error response from daemon: Pool overlaps with other one on this address space")
		}
		n.subnet, n.gateway = o.IPAM.Config[0].Subnet, o.IPAM.Config[0].Gateway
	}
	f.networks[name] = n
	f.ev.add("network-create %s", name)
	return network.CreateResponse{ID: "net-" + name}, nil
}

func (f *fakeDocker) NetworkInspect(_ context.Context, name string, _ network.InspectOptions) (network.Inspect, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.networks[name]
	if !ok {
		return network.Inspect{}, notFound("network " + name)
	}
	eps := map[string]network.EndpointResource{}
	for cname, c := range f.containers {
		if c.networks[name] {
			eps[c.id] = network.EndpointResource{Name: cname}
		}
	}
	for key, cname := range n.orphans {
		eps[key] = network.EndpointResource{Name: cname}
	}
	return network.Inspect{Name: n.name, Internal: n.internal, Labels: n.labels, Options: n.options, Containers: eps,
		IPAM: network.IPAM{Config: []network.IPAMConfig{{Subnet: n.subnet, Gateway: n.gateway}}}}, nil
}

func (f *fakeDocker) NetworkList(context.Context, network.ListOptions) ([]network.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []network.Summary
	for _, n := range f.networks {
		out = append(out, network.Summary{Name: n.name, IPAM: network.IPAM{Config: []network.IPAMConfig{{Subnet: n.subnet}}}})
	}
	return out, nil
}

func (f *fakeDocker) NetworkRemove(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.networks[name]
	if !ok {
		return notFound("network " + name)
	}
	attached := len(n.orphans) + n.staleCount
	for _, c := range f.containers {
		if c.networks[name] {
			attached++
		}
	}
	if attached > 0 {
		return fmt.Errorf("Error response from daemon: error while removing network: network %s id net-%s has active endpoints", name, name)
	}
	delete(f.networks, name)
	f.ev.add("network-remove %s", name)
	return nil
}

func (f *fakeDocker) NetworkConnect(_ context.Context, net, ref string, _ *network.EndpointSettings) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, name, err := f.get(ref)
	if err != nil {
		return err
	}
	if _, ok := f.networks[net]; !ok {
		return notFound("network " + net)
	}
	c.networks[net] = true
	f.resetRoutes(c)
	f.ev.add("connect %s %s", name, net)
	return nil
}

func (f *fakeDocker) NetworkDisconnect(_ context.Context, net, ref string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, name, err := f.get(ref)
	if err != nil && force && f.networks[net] != nil {
		// As the engine: a forced disconnect of a container that no longer exists
		// deletes the network's endpoint of that name.
		for key, cname := range f.networks[net].orphans {
			if cname == ref {
				delete(f.networks[net].orphans, key)
				f.ev.add("drop-endpoint %s %s", net, key)
				return nil
			}
		}
	}
	if err != nil {
		return err
	}
	if !c.networks[net] {
		return fmt.Errorf("container %s is not connected to network %s", name, net)
	}
	if err := f.disconnectErr[net]; err != nil {
		return err
	}
	delete(c.networks, net)
	f.resetRoutes(c)
	f.ev.add("disconnect %s %s", name, net)
	return nil
}

func (f *fakeDocker) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (image.InspectResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.images[ref] {
		return image.InspectResponse{}, notFound("image " + ref)
	}
	return image.InspectResponse{ID: ref}, nil
}
func (f *fakeDocker) ImageBuild(context.Context, io.Reader, build.ImageBuildOptions) (build.ImageBuildResponse, error) {
	panic("not used")
}
func (f *fakeDocker) ImageSave(context.Context, []string, ...client.ImageSaveOption) (io.ReadCloser, error) {
	panic("not used")
}
func (f *fakeDocker) ImageLoad(context.Context, io.Reader, ...client.ImageLoadOption) (image.LoadResponse, error) {
	panic("not used")
}

// resetRoutes does what the real engine does on start, connect and disconnect: one
// default route via the gateway of the preferred network (non-internal first).
func (f *fakeDocker) resetRoutes(c *fakeContainer) {
	if f.routes == nil || !c.running {
		return
	}
	var gw netip.Addr
	for name := range c.networks {
		n := f.networks[name]
		if n == nil {
			continue
		}
		if !gw.IsValid() || !n.internal {
			gw = netip.MustParseAddr(n.gateway)
		}
	}
	f.routes.mu.Lock()
	defer f.routes.mu.Unlock()
	if gw.IsValid() {
		f.routes.defaults[c.pid] = []netip.Addr{gw}
	} else {
		delete(f.routes.defaults, c.pid)
	}
}

// fakeRoutes is the agent's routing table: Docker gives a container a default route
// via its gateway network, like the real engine does.
type fakeRoutes struct {
	ev       *events
	mu       sync.Mutex
	defaults map[int][]netip.Addr
}

func (r *fakeRoutes) DefaultRoutes(pid int) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]netip.Addr(nil), r.defaults[pid]...), nil
}

func (r *fakeRoutes) RemoveDefaultRoutes(pid int, keep netip.Addr) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var kept, removed []netip.Addr
	for _, gw := range r.defaults[pid] {
		if keep.IsValid() && gw == keep {
			kept = append(kept, gw)
		} else {
			removed = append(removed, gw)
		}
	}
	r.defaults[pid] = kept
	r.ev.add("routes-remove %d %v", pid, removed)
	return removed, nil
}

func (r *fakeRoutes) AddDefaultRoute(pid int, gw netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.defaults[pid] = append(r.defaults[pid], gw)
	r.ev.add("routes-add %d %s", pid, gw)
	return nil
}

// fakeLink is the transparent path: Ensure makes the link's gateway the agent's only
// default route, as vethlink does; Remove takes it away. The failure fields fail the
// call of that name.
type fakeLink struct {
	ev                            *events
	routes                        *fakeRoutes
	mu                            sync.Mutex
	tables                        map[int]controller.Drops // by sidecar pid
	problems                      []string                 // what Check reports after Ensure
	ensureErr, removeErr, takeErr error
}

func newFakeLink(ev *events, routes *fakeRoutes) *fakeLink {
	return &fakeLink{ev: ev, routes: routes, tables: map[int]controller.Drops{}}
}

func (l *fakeLink) Ensure(agentPID, sidecarPID int, s egresslink.Spec) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ensureErr != nil {
		return l.ensureErr
	}
	if _, ok := l.tables[sidecarPID]; !ok {
		l.tables[sidecarPID] = controller.Drops{"udp": {}, "icmp": {}, "other": {}, "spoofed": {}}
	}
	l.ev.add("table-ensure %d", sidecarPID)
	l.routes.mu.Lock()
	l.routes.defaults[agentPID] = []netip.Addr{s.Gateway()}
	l.routes.mu.Unlock()
	l.ev.add("link-ensure %d %d %s", agentPID, sidecarPID, s.Link.AgentName)
	return nil
}

func (l *fakeLink) Check(agentPID, sidecarPID int, s egresslink.Spec) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var p []string
	if _, ok := l.tables[sidecarPID]; !ok {
		p = append(p, "table inet compass_transparent is missing")
	}
	if got, _ := l.routes.DefaultRoutes(agentPID); len(got) != 1 || got[0] != s.Gateway() {
		p = append(p, fmt.Sprintf("default routes %v, want only via %v", got, s.Gateway()))
	}
	return append(p, l.problems...), nil
}

func (l *fakeLink) Counters(sidecarPID int, _ egresslink.Spec) (controller.Drops, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.tables[sidecarPID]), nil
}

func (l *fakeLink) TakeCounters(sidecarPID int, _ egresslink.Spec) (controller.Drops, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.takeErr != nil {
		return nil, l.takeErr
	}
	d, ok := l.tables[sidecarPID]
	if !ok {
		return nil, nil
	}
	l.tables[sidecarPID] = controller.Drops{"udp": {}, "icmp": {}, "other": {}, "spoofed": {}}
	l.ev.add("counters-take %d", sidecarPID)
	return d, nil
}

func (l *fakeLink) Remove(agentPID, sidecarPID int, s egresslink.Spec) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.removeErr != nil {
		return l.removeErr
	}
	l.routes.mu.Lock()
	l.routes.defaults[agentPID] = slices.DeleteFunc(l.routes.defaults[agentPID], func(a netip.Addr) bool { return a == s.Gateway() })
	l.routes.mu.Unlock()
	delete(l.tables, sidecarPID)
	l.ev.add("link-remove %d %d", agentPID, sidecarPID)
	return nil
}

func (l *fakeLink) SelfTest() error { return nil }

// linkLocal holds every transparent link's addresses.
var linkLocal = netip.MustParsePrefix("169.254.0.0/16")

// namespaceGone is a sidecar's namespace going away (a restart): its table goes, and
// the veth with it, taking every agent's default route via a link.
func (l *fakeLink) namespaceGone(sidecarPID int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.tables, sidecarPID)
	l.routes.mu.Lock()
	defer l.routes.mu.Unlock()
	for pid, gws := range l.routes.defaults {
		l.routes.defaults[pid] = slices.DeleteFunc(gws, linkLocal.Contains)
	}
}

// drop counts n udp packets in the table of the sidecar pid.
func (l *fakeLink) drop(sidecarPID int, n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d, ok := l.tables[sidecarPID]; ok {
		d["udp"] = controller.DropCount{Packets: d["udp"].Packets + n, Bytes: d["udp"].Bytes + 100*n}
	}
}

// fakeAdmin is a compass-proxy admin API on a unix socket.
type fakeAdmin struct {
	ev         *events
	mu         sync.Mutex
	generation uint64
	current    policy.Policy
	fail       bool        // refuse every PUT with 400
	refuse     policy.Mode // refuse PUTs of this mode with 400
	blocked    uint64      // blocked attempts under the generation in force
	// blockedAfter are the attempts blocked right after a PUT of the mode (a switch's
	// no-network interim: while the controller rewires the agent).
	blockedAfter map[policy.Mode]uint64
	srv          *http.Server
	done         chan struct{}
}

func startFakeAdmin(t *testing.T, socket string, ev *events) *fakeAdmin {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAdmin{ev: ev, generation: 1, current: policy.NoNetwork, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/policy", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.writeAck(w, nil)
	})
	mux.HandleFunc("PUT /v1/policy", func(w http.ResponseWriter, r *http.Request) {
		var body adminapi.PolicyRequest
		err := json.NewDecoder(r.Body).Decode(&body)
		a.mu.Lock()
		defer a.mu.Unlock()
		if err != nil || a.fail || (a.refuse != "" && body.Policy.Mode == a.refuse) || !adminapi.ValidLabel(body.Task) || !adminapi.ValidLabel(body.Phase) {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"refused","errors":["test"]}`)
			a.ev.add("admin-put-refused")
			return
		}
		prev := adminapi.BlockedSummary{Generation: a.generation, Total: a.blocked}
		if a.blocked > 0 {
			prev.Top = []adminapi.BlockedTarget{{Host: "exfil.test", Port: 443, Type: "connect", Reason: "not_allowed", Count: a.blocked}}
		}
		a.generation++
		a.current = body.Policy
		a.blocked = a.blockedAfter[body.Policy.Mode]
		a.ev.add("admin-put %s phase=%s", body.Policy.Mode, body.Phase)
		a.writeAck(w, &prev)
	})
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go func() {
		defer close(a.done)
		_ = a.srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = a.srv.Close()
		<-a.done
	})
	return a
}

// writeAck answers as compass-proxy does: prev, the ended generation's blocked summary,
// only in the answer to a PUT.
func (a *fakeAdmin) writeAck(w http.ResponseWriter, prev *adminapi.BlockedSummary) {
	ack := adminapi.ApplyResult{PolicyStatus: adminapi.PolicyStatus{
		Generation: a.generation, Digest: a.current.Digest(), Mode: a.current.Mode, Policy: a.current,
	}, PreviousBlocked: prev}
	_ = json.NewEncoder(w).Encode(ack)
}
