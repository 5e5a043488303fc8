package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/net/egresslink"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// How a controller process stops at a crash point.
type crashKind int

const (
	// crashKill is SIGKILL: the process stops at that instant and nothing it would have
	// done later (fail-closed steps, deferred clean-up, records) happens; the kernel
	// drops its locks.
	crashKill crashKind = iota
	// crashError is an engine, kernel or sidecar error answering that call.
	crashError
	// crashCancel is Ctrl-C (or a deadline): the command's context ends at that call.
	crashCancel
	// crashPanic is a panic in the call (a client bug), which the caller may recover.
	crashPanic
	// crashPause holds the process at that call until released, then lets it go on:
	// not a crash, a slow controller another one races.
	crashPause
)

func (k crashKind) String() string {
	return [...]string{"kill", "error", "cancel", "panic", "pause"}[k]
}

var (
	errKilled   = errors.New("test: the controller process is dead")
	errInjected = errors.New("test: injected engine error")
)

type crashPanicValue struct{ op string }

// crasher counts the calls one controller process makes to the world (the engine, the
// agent's routes, the sidecar's admin API) and crashes it at one of them: before the
// call took effect, or after it did but before the process saw the answer.
type crasher struct {
	at      int    // 1-based index of the call to crash at; 0: never
	atOp    string // or the first call of this name
	failOp  string // every call of this name fails (an engine error), crash or not
	errOnce string // the first call of this name fails (an engine error), crash or not
	after   bool   // crash once the call took effect
	kind    crashKind
	cancel  context.CancelFunc // crashCancel: ends the command's context

	mu    sync.Mutex
	calls []string
	dead  bool
	// inFlight counts the calls under way. A kill waits for the others to take effect
	// before the process counts as dead: the engine completes a request it received
	// before the kill, and the next controller, started after it, sees its result.
	inFlight sync.WaitGroup
	frozen   chan struct{} // closed when a kill (or a pause) stops the process
	release  chan struct{} // closed to let a killed process's goroutine end (as a dead one)
}

func newCrasher(at int, after bool, kind crashKind, cancel context.CancelFunc) *crasher {
	return &crasher{at: at, after: after, kind: kind, cancel: cancel, frozen: make(chan struct{}), release: make(chan struct{})}
}

func (c *crasher) ops() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// call runs f as the process's next call to the world.
func (c *crasher) call(ctx context.Context, op string, f func() error) error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return errKilled
	}
	c.calls = append(c.calls, op)
	c.inFlight.Add(1)
	defer c.inFlight.Done()
	hit := len(c.calls) == c.at || (c.atOp != "" && op == c.atOp)
	if hit {
		c.atOp = ""
	}
	once := c.errOnce != "" && op == c.errOnce
	if once {
		c.errOnce = ""
	}
	c.mu.Unlock()
	if ctx != nil && ctx.Err() != nil {
		return ctx.Err() // the real clients fail every call on an ended context
	}
	if op == c.failOp || once {
		return fmt.Errorf("%s: %w", op, errInjected)
	}
	if hit && !c.after {
		if err := c.crash(op); err != nil || c.kind != crashPause {
			return err
		}
		hit = false // paused: the call goes ahead
	}
	err := f()
	if hit {
		return c.crash(op)
	}
	return err
}

func (c *crasher) crash(op string) error {
	switch c.kind {
	case crashPause:
		close(c.frozen)
		<-c.release
		return nil
	case crashKill:
		c.mu.Lock()
		c.dead = true
		c.mu.Unlock()
		c.inFlight.Done() // this call's own, which call gives back once more on return
		c.inFlight.Wait()
		c.inFlight.Add(1)
		close(c.frozen)
		<-c.release
		return errKilled
	case crashCancel:
		c.cancel()
		return context.Canceled
	case crashPanic:
		if strings.HasPrefix(op, "admin ") {
			// Not in net/http's round trip: it would strand the client's timeout
			// goroutine. The admin call fails instead.
			return fmt.Errorf("%s: %w", op, errInjected)
		}
		panic(crashPanicValue{op})
	default:
		return fmt.Errorf("%s: %w", op, errInjected)
	}
}

// crashDocker is the engine as one controller process sees it.
type crashDocker struct {
	dockerAPI
	c *crasher
}

func (d crashDocker) ContainerCreate(ctx context.Context, cfg *container.Config, hc *container.HostConfig, nc *network.NetworkingConfig, pl *ocispec.Platform, name string) (r container.CreateResponse, err error) {
	err = d.c.call(ctx, "create "+name, func() (e error) { r, e = d.dockerAPI.ContainerCreate(ctx, cfg, hc, nc, pl, name); return })
	return r, err
}

func (d crashDocker) ContainerStart(ctx context.Context, ref string, o container.StartOptions) error {
	return d.c.call(ctx, "start "+ref, func() error { return d.dockerAPI.ContainerStart(ctx, ref, o) })
}

func (d crashDocker) ContainerInspect(ctx context.Context, ref string) (r container.InspectResponse, err error) {
	err = d.c.call(ctx, "inspect "+ref, func() (e error) { r, e = d.dockerAPI.ContainerInspect(ctx, ref); return })
	return r, err
}

func (d crashDocker) ContainerList(ctx context.Context, o container.ListOptions) (r []container.Summary, err error) {
	err = d.c.call(ctx, "list", func() (e error) { r, e = d.dockerAPI.ContainerList(ctx, o); return })
	return r, err
}

func (d crashDocker) ContainerStop(ctx context.Context, ref string, o container.StopOptions) error {
	return d.c.call(ctx, "stop "+ref, func() error { return d.dockerAPI.ContainerStop(ctx, ref, o) })
}

func (d crashDocker) ContainerRemove(ctx context.Context, ref string, o container.RemoveOptions) error {
	return d.c.call(ctx, "remove "+ref, func() error { return d.dockerAPI.ContainerRemove(ctx, ref, o) })
}

func (d crashDocker) ContainerLogs(ctx context.Context, ref string, o container.LogsOptions) (r io.ReadCloser, err error) {
	err = d.c.call(ctx, "logs "+ref, func() (e error) { r, e = d.dockerAPI.ContainerLogs(ctx, ref, o); return })
	return r, err
}

func (d crashDocker) NetworkCreate(ctx context.Context, name string, o network.CreateOptions) (r network.CreateResponse, err error) {
	err = d.c.call(ctx, "network-create "+name, func() (e error) { r, e = d.dockerAPI.NetworkCreate(ctx, name, o); return })
	return r, err
}

func (d crashDocker) NetworkInspect(ctx context.Context, name string, o network.InspectOptions) (r network.Inspect, err error) {
	err = d.c.call(ctx, "network-inspect "+name, func() (e error) { r, e = d.dockerAPI.NetworkInspect(ctx, name, o); return })
	return r, err
}

func (d crashDocker) NetworkList(ctx context.Context, o network.ListOptions) (r []network.Summary, err error) {
	err = d.c.call(ctx, "network-list", func() (e error) { r, e = d.dockerAPI.NetworkList(ctx, o); return })
	return r, err
}

func (d crashDocker) NetworkRemove(ctx context.Context, name string) error {
	return d.c.call(ctx, "network-remove "+name, func() error { return d.dockerAPI.NetworkRemove(ctx, name) })
}

func (d crashDocker) NetworkConnect(ctx context.Context, net, ref string, es *network.EndpointSettings) error {
	return d.c.call(ctx, "connect "+ref+" "+net, func() error { return d.dockerAPI.NetworkConnect(ctx, net, ref, es) })
}

func (d crashDocker) NetworkDisconnect(ctx context.Context, net, ref string, force bool) error {
	return d.c.call(ctx, "disconnect "+ref+" "+net, func() error { return d.dockerAPI.NetworkDisconnect(ctx, net, ref, force) })
}

func (d crashDocker) ImageInspect(ctx context.Context, ref string, o ...client.ImageInspectOption) (r image.InspectResponse, err error) {
	err = d.c.call(ctx, "image-inspect "+ref, func() (e error) { r, e = d.dockerAPI.ImageInspect(ctx, ref, o...); return })
	return r, err
}

// crashRoutes is the agent's namespace as one controller process sees it.
type crashRoutes struct {
	routeTable
	c *crasher
}

func (r crashRoutes) DefaultRoutes(pid int) (out []netip.Addr, err error) {
	err = r.c.call(nil, "routes-list", func() (e error) { out, e = r.routeTable.DefaultRoutes(pid); return })
	return out, err
}

func (r crashRoutes) RemoveDefaultRoutes(pid int, keep netip.Addr) (out []netip.Addr, err error) {
	err = r.c.call(nil, "routes-remove", func() (e error) { out, e = r.routeTable.RemoveDefaultRoutes(pid, keep); return })
	return out, err
}

func (r crashRoutes) AddDefaultRoute(pid int, gw netip.Addr) error {
	return r.c.call(nil, "routes-add", func() error { return r.routeTable.AddDefaultRoute(pid, gw) })
}

// crashLink is the transparent path as one controller process sees it.
type crashLink struct {
	transparentLink
	c *crasher
}

func (l crashLink) Ensure(a, s int, sp egresslink.Spec) error {
	return l.c.call(nil, "link-ensure", func() error { return l.transparentLink.Ensure(a, s, sp) })
}

func (l crashLink) Check(a, s int, sp egresslink.Spec) (out []string, err error) {
	err = l.c.call(nil, "link-check", func() (e error) { out, e = l.transparentLink.Check(a, s, sp); return })
	return out, err
}

func (l crashLink) TakeCounters(s int, sp egresslink.Spec) (out controller.Drops, err error) {
	err = l.c.call(nil, "link-take", func() (e error) { out, e = l.transparentLink.TakeCounters(s, sp); return })
	return out, err
}

func (l crashLink) Remove(a, s int, sp egresslink.Spec) error {
	return l.c.call(nil, "link-remove", func() error { return l.transparentLink.Remove(a, s, sp) })
}

// crashTransport is the sidecar's admin API as one controller process sees it.
type crashTransport struct {
	rt http.RoundTripper
	c  *crasher
}

func (t crashTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var resp *http.Response
	err := t.c.call(req.Context(), "admin "+req.Method+" "+req.URL.Path, func() (e error) { resp, e = t.rt.RoundTrip(req); return })
	if err != nil {
		if resp != nil {
			resp.Body.Close()
		}
		return nil, err
	}
	return resp, nil
}

// process is one compassctl process on the rig's engine, crashing as c says.
func (r *rig) process(t *testing.T, c *crasher) *Provider {
	t.Helper()
	p, err := New(crashDocker{dockerAPI: r.docker, c: c}, r.p.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.routes = crashRoutes{routeTable: r.routes, c: c}
	p.link = crashLink{transparentLink: r.link, c: c}
	p.adminTransport = func(rt http.RoundTripper) http.RoundTripper { return crashTransport{rt: rt, c: c} }
	return p
}

// dropLocks does what the kernel does for a killed process: it releases every lock the
// process held in the state directory.
func dropLocks(t *testing.T, stateDir string) {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range fds {
		fd, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		link, err := os.Readlink(filepath.Join("/proc/self/fd", d.Name()))
		if err != nil || !strings.HasPrefix(link, stateDir) {
			continue
		}
		_ = syscall.Flock(fd, syscall.LOCK_UN)
	}
}

// world is what the agent has at one instant.
type world struct {
	agentRunning    bool
	agentNets       []string
	agentOnEgress   bool
	routes          []netip.Addr // Docker's: every default route but the link's
	linkRoute       bool         // a default route via the transparent link (to the sidecar only)
	table           bool         // the sidecar has the transparent table
	sidecarExists   bool
	sidecarRunning  bool
	sidecarOnEgress bool
	rules           policy.Policy // what the sidecar enforces
}

func (r *rig) world(agent, sidecar string) world {
	r.docker.mu.Lock()
	var w world
	if c, _, err := r.docker.get(agent); err == nil {
		w.agentRunning = c.running
		for n := range c.networks {
			w.agentNets = append(w.agentNets, n)
		}
		w.agentOnEgress = c.networks["test-egress"]
		if c.running {
			r.routes.mu.Lock()
			for _, gw := range r.routes.defaults[c.pid] {
				if linkLocal.Contains(gw) {
					w.linkRoute = true
				} else {
					w.routes = append(w.routes, gw)
				}
			}
			r.routes.mu.Unlock()
		}
	}
	if c, _, err := r.docker.get(sidecar); err == nil {
		w.sidecarExists, w.sidecarRunning, w.sidecarOnEgress = true, c.running, c.networks["test-egress"]
		r.link.mu.Lock()
		_, w.table = r.link.tables[c.pid]
		r.link.mu.Unlock()
	}
	r.docker.mu.Unlock()
	r.admin.mu.Lock()
	w.rules = r.admin.current
	r.admin.mu.Unlock()
	return w
}

// direct is a way out past the sidecar: on the egress network with a default route.
func (w world) direct() bool { return w.agentRunning && w.agentOnEgress && len(w.routes) > 0 }

// proxiedOut is a way out through the sidecar.
func (w world) proxiedOut() bool {
	return w.sidecarRunning && w.sidecarOnEgress && w.rules.Mode != policy.ModeNoNetwork
}

func (w world) noEgress() bool { return !w.direct() && !w.proxiedOut() }

// within reports whether the agent's egress is within what one of the policies allows.
func (w world) within(pols ...policy.Policy) bool {
	public := false
	for _, p := range pols {
		public = public || p.Mode == policy.ModePublic
	}
	if w.direct() && !public {
		return false
	}
	if !w.proxiedOut() {
		return true
	}
	for _, p := range pols {
		if w.rules.Digest() == p.Digest() {
			return true
		}
	}
	return w.rules.Mode == policy.ModeNoNetwork
}

// matches reports whether the world is exactly pol in force.
func (w world) matches(pol policy.Policy) bool {
	if !w.agentRunning || !w.sidecarRunning || !w.sidecarOnEgress || w.rules.Digest() != pol.Digest() {
		return false
	}
	if pol.Restricted() {
		return !w.agentOnEgress && len(w.routes) == 0 && w.linkRoute && w.table
	}
	return w.agentOnEgress && len(w.routes) == 1 && !w.linkRoute && !w.table
}

// cmdEnd is how one command ended.
type cmdEnd struct {
	err    error
	panic  any
	killed bool          // stopped at its crash point (killed, or paused)
	done   chan struct{} // closed when the command's goroutine returned (a killed one only once released)
}

// runCrashing runs cmd as a process crashing as c says, and returns once it ended or
// was killed.
func runCrashing(t *testing.T, c *crasher, cmd func() error) *cmdEnd {
	t.Helper()
	o := &cmdEnd{done: make(chan struct{})}
	res := make(chan struct{})
	go func() {
		defer close(o.done)
		defer func() {
			if p := recover(); p != nil {
				o.panic = p
			}
			close(res)
		}()
		o.err = cmd()
	}()
	select {
	case <-res:
	case <-c.frozen:
		o.killed = true
	case <-time.After(30 * time.Second):
		t.Fatalf("command hung; calls %v", c.ops())
	}
	return o
}

// killedSet holds the goroutines of killed processes until the end of a test: then they
// go on, every call they make failing as a dead process's would (what they still try,
// retries and timeouts, takes a while: all of them at once, not one after the other).
type killedSet struct {
	mu   sync.Mutex
	list []func()
}

func newKilledSet(t *testing.T) *killedSet {
	k := &killedSet{}
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for i := 0; i < len(k.list); i += 2 {
			k.list[i]()
		}
		for i := 1; i < len(k.list); i += 2 {
			k.list[i]()
		}
	})
	return k
}

// add parks a killed command: its locks go now, its goroutine goes on (dead) at the end
// of the test, all of them together.
func (k *killedSet) add(t *testing.T, o *cmdEnd, c *crasher, stateDir string) {
	t.Helper()
	dropLocks(t, stateDir)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.list = append(k.list, func() { close(c.release) }, func() { <-o.done })
}

// countCalls runs cmd without a crash and returns the calls it made.
func countCalls(t *testing.T, cmd func(c *crasher) error) []string {
	t.Helper()
	c := newCrasher(0, false, crashKill, nil)
	if err := cmd(c); err != nil {
		t.Fatalf("clean run: %v", err)
	}
	return c.ops()
}

type crashPoint struct {
	at    int
	after bool
	kind  crashKind
	op    string
}

func (p crashPoint) String() string {
	when := "before"
	if p.after {
		when = "after"
	}
	return fmt.Sprintf("%s_%s_%d_%s", p.kind, when, p.at, p.op)
}

func crashPoints(ops []string, kinds ...crashKind) []crashPoint {
	var out []crashPoint
	for _, k := range kinds {
		for i, op := range ops {
			for _, after := range []bool{false, true} {
				out = append(out, crashPoint{at: i + 1, after: after, kind: k, op: op})
			}
		}
	}
	return out
}

// A switch crashed at any call, in any way, leaves the agent at every instant within
// what the old or the new policy allows; a restricting one that has cut the agent's
// direct wiring, within what the new one allows; one that survives its crash (an error,
// a cancel, a panic) leaves it no egress at all. A later status never reports ok unless
// the intended policy is fully in force, and a switch to it repairs.
func TestSwitchCrashAtEveryStep(t *testing.T) {
	const task = "tc"
	pairs := []struct{ from, to policy.Policy }{
		{policy.Public, policy.NoNetwork},
		{policy.Public, allowA},
		{policy.NoNetwork, policy.Public},
		{allowA, policy.Public},
		{allowA, policy.NoNetwork},
		{policy.Public, policy.Public},
	}
	label := controller.PhaseLabel{Phase: "run"}
	killed := newKilledSet(t)
	for _, pair := range pairs {
		name := string(pair.from.Mode) + "_to_" + string(pair.to.Mode)
		// switchCmd is `compassctl env switch`; applying says whether it got past the
		// lookup, before which a failure changes nothing.
		switchCmd := func(r *rig, c *crasher, ctx context.Context, applying *bool) error {
			e, err := r.process(t, c).LookupTask(ctx, task, lifecycle.RoleAgent)
			if err != nil {
				return err
			}
			*applying = true
			_, err = e.Apply(ctx, pair.to, label)
			return err
		}
		clean := newRig(t, task)
		clean.open(t, task, pair.from)
		ops := countCalls(t, func(c *crasher) error { return switchCmd(clean, c, context.Background(), new(bool)) })
		for _, pt := range crashPoints(ops, crashKill, crashError, crashCancel, crashPanic) {
			t.Run(name+"/"+pt.String(), func(t *testing.T) {
				r := newRig(t, task)
				e := r.open(t, task, pair.from)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				c := newCrasher(pt.at, pt.after, pt.kind, cancel)
				applying := false
				o := runCrashing(t, c, func() error { return switchCmd(r, c, ctx, &applying) })
				w := r.world(e.AgentContainer(), e.SidecarContainer())
				switch {
				case !w.within(pair.from, pair.to):
					t.Errorf("crashed switch left egress beyond %s and %s: %+v", pair.from.Mode, pair.to.Mode, w)
				case !pair.from.Restricted() && pair.to.Restricted() && !w.agentOnEgress && !w.within(pair.to):
					t.Errorf("crashed switch cut the agent's direct wiring but left the sidecar enforcing %s, beyond %s: %+v", w.rules.Mode, pair.to.Mode, w)
				case o.killed:
				case !applying:
					if !w.matches(pair.from) {
						t.Errorf("a switch that failed in its lookup changed the world: %+v", w)
					}
				case o.err == nil && o.panic == nil:
					if !w.matches(pair.to) {
						t.Errorf("switch reported success but %s is not in force: %+v", pair.to.Mode, w)
					}
				case !w.noEgress():
					t.Errorf("switch failed (err %v, panic %v) but the agent has egress: %+v", o.err, o.panic, w)
				}
				if o.killed {
					killed.add(t, o, c, r.p.cfg.StateDir)
				}
				// A switch killed once it wrote its intent did not end: status says so,
				// whatever the world looks like.
				r.checkStatusThenRepair(t, task, w, o.killed)
			})
		}
	}
}

// A restricting switch from public that fails before its no-network interim is in the
// sidecar (a step errs, or Ctrl-C) fails closed; a kill during those fail-closed steps
// (a second Ctrl-C abandons the run at once) must not leave the agent cut from its
// direct wiring beside a sidecar that still lets public through: at every call of
// them, the agent keeps its old wiring or has nothing beyond the new policy.
func TestSwitchKilledWhileFailingClosed(t *testing.T) {
	const task = "tk"
	label := controller.PhaseLabel{Phase: "run"}
	killed := newKilledSet(t)
	for _, to := range []policy.Policy{allowA, policy.NoNetwork} {
		for _, fail := range []struct {
			op   string
			once bool
		}{
			{"admin PUT /v1/policy", true},  // the interim PUT fails, the fail-closed one goes through
			{"admin PUT /v1/policy", false}, // the sidecar takes no PUT, the fail-closed one neither
		} {
			failOp := fail.op
			switchCmd := func(r *rig, c *crasher) error {
				e, err := r.process(t, c).LookupTask(context.Background(), task, lifecycle.RoleAgent)
				if err != nil {
					return err
				}
				_, err = e.Apply(context.Background(), to, label)
				return err
			}
			clean := newRig(t, task)
			clean.open(t, task, policy.Public)
			failing := func(c *crasher) *crasher {
				if fail.once {
					c.errOnce = failOp
				} else {
					c.failOp = failOp
				}
				return c
			}
			c := failing(newCrasher(0, false, crashKill, nil))
			if err := switchCmd(clean, c); err == nil {
				t.Fatalf("%s: the switch succeeded though %q failed", to.Mode, failOp)
			}
			ops := c.ops()
			first := slices.Index(ops, failOp)
			for i := first + 1; i < len(ops); i++ {
				for _, after := range []bool{false, true} {
					pt := crashPoint{at: i + 1, after: after, kind: crashKill, op: ops[i]}
					t.Run(fmt.Sprintf("%s/%s_once=%t/%s", to.Mode, failOp, fail.once, pt), func(t *testing.T) {
						r := newRig(t, task)
						e := r.open(t, task, policy.Public)
						c := failing(newCrasher(pt.at, pt.after, crashKill, nil))
						o := runCrashing(t, c, func() error { return switchCmd(r, c) })
						w := r.world(e.AgentContainer(), e.SidecarContainer())
						if !w.within(policy.Public, to) || !w.agentOnEgress && !w.within(to) {
							t.Errorf("killed while failing closed: egress beyond %s once the agent was cut: %+v", to.Mode, w)
						}
						if o.killed {
							killed.add(t, o, c, r.p.cfg.StateDir)
						}
					})
				}
			}
		}
	}
}

// checkStatusThenRepair, from a fresh process: status is ok only if what it intends is
// fully in force, and never after a switch killed before it ended; a switch to the
// intended policy then puts it in force.
func (r *rig) checkStatusThenRepair(t *testing.T, task string, w world, killed bool) {
	t.Helper()
	ctx := context.Background()
	e, err := r.process(t, newCrasher(0, false, crashKill, nil)).LookupTask(ctx, task, lifecycle.RoleAgent)
	if err != nil {
		t.Fatalf("lookup after the crash: %v", err)
	}
	st, err := e.Status(ctx)
	if err != nil {
		t.Fatalf("status after the crash: %v", err)
	}
	in, ok, err := e.dir.readIntent()
	if err != nil || !ok {
		t.Fatalf("no intent after the crash: %v", err)
	}
	if st.OK && !w.matches(in.Policy) {
		t.Errorf("status ok with %s intended, but the world is %+v", in.Policy.Mode, w)
	}
	if st.OK && killed && in.Phase != "baseline" {
		t.Errorf("status ok after a switch to %s killed before it was recorded", in.Policy.Mode)
	}
	if _, err := e.Apply(ctx, in.Policy, controller.PhaseLabel{Phase: "repair"}); err != nil {
		t.Fatalf("repair switch to %s: %v", in.Policy.Mode, err)
	}
	if st, err := e.Status(ctx); err != nil || !st.OK {
		t.Errorf("status after the repair: %v %v", err, st.Problems)
	}
}

// closeCmd is `compassctl env close`: by lookup, or by name once the sidecar is gone.
func closeCmd(ctx context.Context, p *Provider, task string) error {
	e, err := p.LookupTask(ctx, task, lifecycle.RoleAgent)
	if errors.Is(err, ErrNoEnvironment) {
		return p.RemoveByName(ctx, task)
	}
	if err != nil {
		return err
	}
	return e.Close(ctx, false)
}

// A close that fails (or dies) before an attached container is off the egress network
// must leave a later close able to find it: the sidecar, whose label names it, goes
// only after it. It used to go concurrently, and a second close, finding no sidecar,
// removed what it found by name, which never includes an attached container: that
// container stayed on the egress network, with full egress, under no environment.
func TestCloseOfAttachedAgentCanBeRepeated(t *testing.T) {
	for _, baseline := range []policy.Policy{policy.Public, policy.NoNetwork} {
		t.Run(string(baseline.Mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRig(t, "ta")
			runUserContainer(t, r)
			if _, err := r.p.Attach(ctx, controller.EnvSpec{Task: "ta", Baseline: baseline, ProxyStartTimeout: 5 * time.Second}, "user"); err != nil {
				t.Fatal(err)
			}
			for _, net := range []string{"test-egress", "compass-net-ta"} {
				r.docker.disconnectErr = map[string]error{net: errors.New("driver error")}
				if err := closeCmd(ctx, r.p, "ta"); err == nil && net == "test-egress" && baseline.Mode == policy.ModePublic {
					t.Errorf("close succeeded though the attached container could not leave %s", net)
				}
			}
			r.docker.disconnectErr = nil
			if err := closeCmd(ctx, r.p, "ta"); err != nil {
				t.Fatalf("second close: %v", err)
			}
			ci, err := r.docker.ContainerInspect(ctx, "user")
			if err != nil {
				t.Fatal(err)
			}
			if got := otherNetworks(ci); len(got) != 0 {
				t.Errorf("attached container left on %v after close", got)
			}
			if _, err := r.docker.ContainerInspect(ctx, "compass-proxy-ta"); err == nil {
				t.Errorf("sidecar left after close")
			}
		})
	}
}

// leftovers lists what is left of environment env on the fake engine.
func (r *rig) leftovers(env string) []string {
	n := namesFor(env)
	r.docker.mu.Lock()
	defer r.docker.mu.Unlock()
	var out []string
	for _, c := range []string{n.Sidecar, n.Agent} {
		if _, ok := r.docker.containers[c]; ok {
			out = append(out, c)
		}
	}
	if _, ok := r.docker.networks[n.Network]; ok {
		out = append(out, n.Network)
	}
	if c, ok := r.docker.containers["user"]; ok && len(c.networks) > 0 {
		for net := range c.networks {
			if net != "bridge" {
				out = append(out, "user on "+net)
			}
		}
	}
	return out
}

// An open (or attach) crashed at any call leaves the agent within its baseline (no
// egress but the baseline's); one that survives its crash removes what it made. A later
// status is ok only for the baseline fully in force, a second open refuses or succeeds
// whole, and close removes everything.
func TestOpenCrashAtEveryStep(t *testing.T) {
	const task = "to"
	killed := newKilledSet(t)
	for _, attach := range []bool{false, true} {
		for _, baseline := range []policy.Policy{policy.NoNetwork, allowA, policy.Public} {
			name := string(baseline.Mode)
			agent := "compass-agent-" + task
			if attach {
				name, agent = "attach_"+name, "user"
			}
			openCmd := func(r *rig, c *crasher, ctx context.Context) error {
				spec := controller.EnvSpec{Task: task, Image: "agent:1", Baseline: baseline, ProxyStartTimeout: 5 * time.Second}
				p := r.process(t, c)
				if attach {
					spec.Image = ""
					_, err := p.Attach(ctx, spec, "user")
					return err
				}
				_, err := p.OpenEnv(ctx, spec)
				return err
			}
			clean := newRig(t, task)
			runUserContainer(t, clean)
			ops := countCalls(t, func(c *crasher) error { return openCmd(clean, c, context.Background()) })
			// Agent creation runs beside the sidecar's start: no panic there (it would
			// end the test binary), and the call order varies from run to run.
			for _, pt := range crashPoints(ops, crashKill, crashError, crashCancel) {
				t.Run(name+"/"+pt.String(), func(t *testing.T) {
					r := newRig(t, task)
					runUserContainer(t, r)
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					c := newCrasher(pt.at, pt.after, pt.kind, cancel)
					o := runCrashing(t, c, func() error { return openCmd(r, c, ctx) })
					w := r.world(agent, "compass-proxy-"+task)
					// The sidecar starts as no-network. (An attached container's own network,
					// until the move takes it off, is its creator's egress, not counted here.)
					if !w.within(policy.NoNetwork, baseline) {
						t.Errorf("crashed open left egress beyond %s: %+v", baseline.Mode, w)
					}
					if !o.killed {
						if o.err == nil {
							if !w.matches(baseline) {
								t.Errorf("open reported success but %s is not in force: %+v", baseline.Mode, w)
							}
						} else if left := r.leftovers(task); len(left) > 0 {
							t.Errorf("failed open (%v) left %v", o.err, left)
						}
					} else {
						killed.add(t, o, c, r.p.cfg.StateDir)
					}
					fresh := r.process(t, newCrasher(0, false, crashKill, nil))
					if e, err := fresh.LookupTask(ctx, task, lifecycle.RoleAgent); err == nil {
						st, err := e.Status(context.Background())
						if err == nil && st.OK && !w.matches(baseline) {
							t.Errorf("status ok after a crashed open: %+v", w)
						}
					}
					if err := closeCmd(context.Background(), fresh, task); err != nil {
						t.Fatalf("close after the crash: %v", err)
					}
					if left := r.leftovers(task); len(left) > 0 {
						t.Errorf("close after a crashed open left %v", left)
					}
				})
			}
		}
	}
}

// A close crashed at any call never gives the agent egress its policy did not, and a
// later close removes everything: a created agent, the sidecar and the task network go,
// an attached container is left on no network of the environment.
func TestCloseCrashAtEveryStep(t *testing.T) {
	const task = "tx"
	killed := newKilledSet(t)
	for _, attach := range []bool{false, true} {
		for _, pol := range []policy.Policy{policy.NoNetwork, policy.Public} {
			name, agent := string(pol.Mode), "compass-agent-"+task
			if attach {
				name, agent = "attach_"+name, "user"
			}
			setUp := func(t *testing.T) *rig {
				r := newRig(t, task)
				runUserContainer(t, r)
				if err := openOrAttach(r, task, pol, attach); err != nil {
					t.Fatal(err)
				}
				return r
			}
			clean := setUp(t)
			// Agent and sidecar go concurrently: no panics, and the order varies.
			ops := countCalls(t, func(c *crasher) error { return closeCmd(context.Background(), clean.process(t, c), task) })
			for _, pt := range crashPoints(ops, crashKill, crashError, crashCancel) {
				t.Run(name+"/"+pt.String(), func(t *testing.T) {
					r := setUp(t)
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					c := newCrasher(pt.at, pt.after, pt.kind, cancel)
					o := runCrashing(t, c, func() error { return closeCmd(ctx, r.process(t, c), task) })
					if w := r.world(agent, "compass-proxy-"+task); !w.within(pol) {
						t.Errorf("crashed close left egress beyond %s: %+v", pol.Mode, w)
					}
					if o.killed {
						killed.add(t, o, c, r.p.cfg.StateDir)
					}
					if err := closeCmd(context.Background(), r.process(t, newCrasher(0, false, crashKill, nil)), task); err != nil {
						t.Fatalf("close after the crash: %v", err)
					}
					if left := r.leftovers(task); len(left) > 0 {
						t.Errorf("close after a crashed close left %v", left)
					}
				})
			}
		}
	}
}

// signalHandler closes seen the first time a record's message contains msg.
type signalHandler struct {
	msg  string
	once sync.Once
	seen chan struct{}
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }

// A close racing a switch to public waits for it: otherwise the switch, resumed after
// close took the attached container off every network, connected it to the egress
// network and recorded its success before close removed the environment, leaving the
// container with full egress under no environment at all.
func TestCloseWaitsForASwitchInFlight(t *testing.T) {
	const task = "tr"
	ctx := context.Background()
	r := newRig(t, task)
	runUserContainer(t, r)
	if _, err := r.p.Attach(ctx, controller.EnvSpec{Task: task, Baseline: policy.NoNetwork, ProxyStartTimeout: 5 * time.Second}, "user"); err != nil {
		t.Fatal(err)
	}
	sw := newCrasher(0, false, crashPause, nil)
	sw.atOp = "connect id-user test-egress"
	swEnd := runCrashing(t, sw, func() error {
		e, err := r.process(t, sw).LookupTask(ctx, task, lifecycle.RoleAgent)
		if err != nil {
			return err
		}
		_, err = e.Apply(ctx, policy.Public, controller.PhaseLabel{Phase: "run"})
		return err
	})
	if !swEnd.killed {
		t.Fatalf("the switch never reached the connect: %v", swEnd.err)
	}
	cl := newCrasher(0, false, crashPause, nil)
	cl.atOp = "network-remove compass-net-" + task
	waiting := &signalHandler{msg: "waiting for another controller's lock", seen: make(chan struct{})}
	clEnd := &cmdEnd{done: make(chan struct{})}
	go func() {
		defer close(clEnd.done)
		p := r.process(t, cl)
		p.log = slog.New(waiting)
		clEnd.err = closeCmd(ctx, p, task)
	}()
	select {
	case <-cl.frozen: // close got past the lock while the switch held it
		close(sw.release)
		<-swEnd.done
		close(cl.release)
	case <-waiting.seen: // close waits for the switch
		close(sw.release)
		<-swEnd.done
		select {
		case <-cl.frozen:
		case <-clEnd.done:
		}
		close(cl.release)
	}
	<-clEnd.done
	if clEnd.err != nil {
		t.Errorf("close: %v", clEnd.err)
	}
	ci, err := r.docker.ContainerInspect(ctx, "user")
	if err != nil {
		t.Fatal(err)
	}
	if got := otherNetworks(ci); len(got) != 0 {
		t.Errorf("attached container on %v after close (switch: %v)", got, swEnd.err)
	}
}

// An open whose rollback cannot remove the sidecar leaves the task network beside it,
// so that close finds the environment and removes the rest: it used to remove the
// network, and every later close (and open: "already exists") refused for good.
func TestFailedOpenLeftoversCanBeClosed(t *testing.T) {
	const task = "tf"
	r := newRig(t, task)
	c := newCrasher(0, false, crashError, nil)
	c.atOp, c.failOp = "start compass-proxy-"+task, "remove compass-proxy-"+task
	_, err := r.process(t, c).OpenEnv(context.Background(), controller.EnvSpec{Task: task, Image: "agent:1", Baseline: policy.NoNetwork, ProxyStartTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "cleanup failed") {
		t.Fatalf("open: %v, want its start and its cleanup to fail", err)
	}
	if err := closeCmd(context.Background(), r.p, task); err != nil {
		t.Fatalf("close after the failed open: %v", err)
	}
	if left := r.leftovers(task); len(left) > 0 {
		t.Errorf("close after a failed open left %v", left)
	}
}

// Docker restarting the agent (its default routes come back) or the sidecar (it comes
// back as no-network, without the rules it was given) is seen by status unless the
// world is still exactly the intended policy, and a switch to the intended policy
// repairs it.
func TestRestartsAreDetectedAndRepaired(t *testing.T) {
	const task = "tr2"
	restarts := map[string]func(r *rig, e *Env){
		"agent restarted": func(r *rig, e *Env) {
			_ = r.docker.ContainerStart(context.Background(), e.AgentContainer(), container.StartOptions{})
		},
		"sidecar restarted": func(r *rig, e *Env) {
			old, _ := r.docker.ContainerInspect(context.Background(), e.SidecarContainer())
			_ = r.docker.ContainerStart(context.Background(), e.SidecarContainer(), container.StartOptions{})
			r.link.namespaceGone(old.State.Pid)
			r.admin.mu.Lock()
			r.admin.current, r.admin.generation = policy.NoNetwork, 1
			r.admin.mu.Unlock()
		},
		"sidecar stopped": func(r *rig, e *Env) {
			_ = r.docker.ContainerStop(context.Background(), e.SidecarContainer(), container.StopOptions{})
		},
	}
	for _, tc := range []struct {
		restart string
		pol     policy.Policy
		ok      bool // the world is still exactly the policy
	}{
		{"agent restarted", policy.Public, true},
		{"agent restarted", allowA, false},
		{"agent restarted", policy.NoNetwork, false},
		{"sidecar restarted", policy.Public, false},
		{"sidecar restarted", allowA, false},
		{"sidecar restarted", policy.NoNetwork, false}, // its table and link went with its namespace
		{"sidecar stopped", policy.Public, false},
		{"sidecar stopped", allowA, false},
	} {
		t.Run(tc.restart+"/"+string(tc.pol.Mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRig(t, task)
			e := r.open(t, task, tc.pol)
			restarts[tc.restart](r, e)
			w := r.world(e.AgentContainer(), e.SidecarContainer())
			if !w.within(tc.pol) {
				t.Errorf("after the restart the agent has egress beyond %s: %+v", tc.pol.Mode, w)
			}
			st, err := e.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.OK != tc.ok || st.OK != w.matches(tc.pol) {
				t.Errorf("status ok=%t (%v), want %t", st.OK, st.Problems, tc.ok)
			}
			if _, err := e.Apply(ctx, tc.pol, controller.PhaseLabel{Phase: "repair"}); err != nil {
				t.Fatalf("repair: %v", err)
			}
			if st, err := e.Status(ctx); err != nil || !st.OK {
				t.Errorf("status after the repair: %v %v", err, st.Problems)
			}
		})
	}
}

// A switch that panics (a client bug) fails closed and records its end, failed, as any
// failed switch does: the runner recovers and may retain the environment, and status
// must not then say its controller was killed or is still at work.
func TestSwitchPanicIsRecorded(t *testing.T) {
	for _, tc := range []struct {
		from, to policy.Policy
		op       string // the call that panics
	}{
		{policy.Public, policy.NoNetwork, "routes-remove"},
		{policy.NoNetwork, policy.Public, "routes-remove"},
	} {
		t.Run(string(tc.from.Mode)+"_to_"+string(tc.to.Mode), func(t *testing.T) {
			const task = "tp"
			ctx := context.Background()
			r := newRig(t, task)
			r.open(t, task, tc.from)
			c := newCrasher(0, false, crashPanic, nil)
			c.atOp = tc.op
			o := runCrashing(t, c, func() error {
				e, err := r.process(t, c).LookupTask(ctx, task, lifecycle.RoleAgent)
				if err != nil {
					return err
				}
				_, err = e.Apply(ctx, tc.to, controller.PhaseLabel{Phase: "run"})
				return err
			})
			if o.panic == nil {
				t.Fatalf("the switch did not panic (err %v; calls %v)", o.err, c.ops())
			}
			e, err := r.p.LookupTask(ctx, task, lifecycle.RoleAgent)
			if err != nil {
				t.Fatal(err)
			}
			in, _, err := e.dir.readIntent()
			if err != nil {
				t.Fatal(err)
			}
			trs, err := e.dir.lastTransitions(1)
			if err != nil {
				t.Fatal(err)
			}
			if len(trs) != 1 || !trs[0].Time.Equal(in.Time) || trs[0].OK || !strings.Contains(trs[0].Error, "panicked") {
				t.Fatalf("last transition %+v, want the panicked switch to %s recorded as failed", trs, tc.to.Mode)
			}
			st, err := e.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range st.Problems {
				if strings.Contains(p, "no recorded end") {
					t.Errorf("status after a recovered panic: %q", p)
				}
			}
		})
	}
}
