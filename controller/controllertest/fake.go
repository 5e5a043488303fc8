// Package controllertest is an in-memory provider for testing the runner: it logs every
// open, switch, command and close with the mode in force at that moment, so a test can
// check which policy each step ran under.
package controllertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// Provider is the fake provider. Commands given to Exec follow a small language so that
// task definitions in tests say what a step does:
//
//	exit N      exits with status N
//	hang        blocks until the step's context ends
//	unkillable  as hang, then reports that the cut command may still be running
//	panic       panics in the caller's goroutine
//	blocked N   adds N blocked attempts under the policy in force
//	dropped N   adds N UDP packets the enforcement point dropped under the policy in force
//	cancel      calls Cancel (set by the test), then exits 0
//	stdout TEXT writes TEXT (no newline) to stdout, then exits 0
//	stderr TEXT writes TEXT to stderr, then exits 0
//	anything else exits 0
type Provider struct {
	mu     sync.Mutex
	events []string
	envs   map[string]*Env
	// OpenErr, when set, decides whether opening an environment of that role fails.
	OpenErr func(role lifecycle.Role) error
	// ApplyErr, when set, decides whether a switch to that phase fails.
	ApplyErr func(phase string) error
	// ApplyPanics, when set, decides whether a switch to that phase fails closed and then
	// panics, as the Docker provider's switch does on a bug in its client.
	ApplyPanics func(phase string) bool
	// CloseErr, when set, decides whether closing an environment of that role fails.
	CloseErr func(role lifecycle.Role) error
	// ReattachErr, when set, decides whether reattaching that role fails (other than by
	// the environment being gone: the engine unreachable, say).
	ReattachErr func(role lifecycle.Role) error
	// RemoveErr, when set, decides whether removing what is left of an environment of
	// that role fails.
	RemoveErr func(role lifecycle.Role) error
	// DownloadErr, when set, decides whether copying a file out of an environment fails.
	DownloadErr func() error
	// UploadErr, when set, decides whether copying a file into an environment fails.
	UploadErr func() error
	// Missing lists artifact paths that do not resolve.
	Missing map[string]bool
	// Cancel is called by the "cancel" command (a test's Ctrl-C).
	Cancel func()
	// ReportPrevious makes Apply report the ended generation's blocked summary, taken
	// with the swap as the Docker sidecar does; without it Apply reports none.
	ReportPrevious bool
	// BlockedAtSwitch adds, when a switch to that phase starts, blocked attempts under
	// the outgoing policy: attempts made after the runner's last read, before the swap.
	BlockedAtSwitch map[string]uint64
}

// New returns an empty fake provider.
func New() *Provider { return &Provider{envs: map[string]*Env{}} }

// Name is "fake".
func (p *Provider) Name() string { return "fake" }

// Events is the log so far, one line per operation.
func (p *Provider) Events() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.events...)
}

// Live lists the environments opened and not closed (retained ones included).
func (p *Provider) Live() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for id, e := range p.envs {
		if !e.isClosed() {
			ids = append(ids, id)
		}
	}
	return ids
}

func (p *Provider) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, fmt.Sprintf(format, args...))
}

// Open creates an environment with spec.Baseline in force.
func (p *Provider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	if p.OpenErr != nil {
		if err := p.OpenErr(spec.Role); err != nil {
			p.logf("%s open failed", spec.Role)
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := envID(spec.Task, spec.Role)
	e := &Env{p: p, id: id, role: spec.Role, policy: spec.Baseline, files: map[string]string{}}
	p.mu.Lock()
	if old, ok := p.envs[id]; ok && !old.isClosed() {
		p.mu.Unlock()
		return nil, fmt.Errorf("fake: environment %s exists", id)
	}
	p.envs[id] = e
	p.mu.Unlock()
	p.logf("%s open %s image=%s", spec.Role, spec.Baseline.Mode, spec.Image)
	return e, nil
}

// ReattachingProvider is the fake provider with Reattach, as a provider whose state
// lives outside the process has.
type ReattachingProvider struct{ *Provider }

// Reattach returns the environment left open under that task and role.
func (p ReattachingProvider) Reattach(_ context.Context, task string, role lifecycle.Role) (controller.Environment, error) {
	if p.ReattachErr != nil {
		if err := p.ReattachErr(role); err != nil {
			return nil, err
		}
	}
	id := envID(task, role)
	p.mu.Lock()
	e, ok := p.envs[id]
	p.mu.Unlock()
	if !ok || e.isClosed() {
		return nil, fmt.Errorf("fake: environment %s: %w", id, controller.ErrEnvironmentGone)
	}
	p.logf("%s reattach", role)
	return e, nil
}

// RemoveEnvironment closes the environment of that task and role if one is open. Like
// an engine call, it fails once its context has ended.
func (p ReattachingProvider) RemoveEnvironment(ctx context.Context, task string, role lifecycle.Role) (string, error) {
	id := envID(task, role)
	if p.RemoveErr != nil {
		if err := p.RemoveErr(role); err != nil {
			p.logf("%s remove failed", role)
			return id, err
		}
	}
	if err := ctx.Err(); err != nil {
		p.logf("%s remove failed: %v", role, err)
		return id, err
	}
	p.mu.Lock()
	e, ok := p.envs[id]
	p.mu.Unlock()
	p.logf("%s remove", role)
	if ok && !e.isClosed() {
		return id, e.Close(ctx, false)
	}
	return id, nil
}

// Locks is a host's table of task run locks, shared by the LockingProviders of the
// runners that stand for that host's processes.
type Locks struct {
	mu   sync.Mutex
	held map[string]bool
}

// NewLocks returns a table with no lock held.
func NewLocks() *Locks { return &Locks{held: map[string]bool{}} }

// Hold takes the task's lock as another process would, or reports that it is held.
func (l *Locks) Hold(task string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[task] {
		return false
	}
	l.held[task] = true
	return true
}

// Release lets the task's lock go, as its holder's death would.
func (l *Locks) Release(task string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, task)
}

// LockingProvider is ReattachingProvider with run locks (controller.TaskLocker) in
// Locks; it logs taking and letting go of each.
type LockingProvider struct {
	ReattachingProvider
	Locks *Locks
}

// LockTask takes the task's lock, or fails at once while it is held.
func (p LockingProvider) LockTask(_ context.Context, task string) (func(), error) {
	if !p.Locks.Hold(task) {
		p.logf("lock %s refused", task)
		return nil, fmt.Errorf("fake: task %s: %w: it holds the run lock fake-locks/%s", task, controller.ErrTaskLocked, task)
	}
	p.logf("lock %s", task)
	return func() {
		p.logf("unlock %s", task)
		p.Locks.Release(task)
	}, nil
}

func envID(task string, role lifecycle.Role) string {
	if role == lifecycle.RoleEvaluation {
		return task + "-eval"
	}
	return task
}

// Env is one fake environment.
type Env struct {
	p       *Provider
	id      string
	role    lifecycle.Role
	mu      sync.Mutex
	policy  policy.Policy
	gen     uint64
	blocked uint64
	dropped uint64 // UDP packets dropped under the policy in force
	closed  bool
	files   map[string]string // uploaded files: destination path → source
}

// ID is the task ID, with "-eval" for the evaluation environment.
func (e *Env) ID() string { return e.id }

func (e *Env) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Mode is the mode in force.
func (e *Env) Mode() policy.Mode {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.policy.Mode
}

// Apply switches the policy at once (the fake's enforcement point is itself).
func (e *Env) Apply(ctx context.Context, p policy.Policy, label controller.PhaseLabel) (controller.Transition, error) {
	e.mu.Lock()
	from := e.policy.Mode
	e.blocked += e.p.BlockedAtSwitch[label.Phase]
	e.mu.Unlock()
	var err error
	if e.p.ApplyErr != nil {
		err = e.p.ApplyErr(label.Phase)
	}
	if err == nil {
		err = ctx.Err()
	}
	panics := e.p.ApplyPanics != nil && e.p.ApplyPanics(label.Phase)
	if err != nil || panics {
		// As Environment.Apply promises: a switch that fails, however it fails, leaves no egress.
		_, prev := e.swap(policy.NoNetwork)
		e.p.logf("%s apply %s %s failed", e.role, label.Phase, p.Mode)
		if panics {
			panic("controllertest: switch to " + label.Phase + " panicked")
		}
		return controller.Transition{FromMode: from, ToMode: p.Mode, PreviousBlocked: prev}, err
	}
	dropped := e.takeDropped()
	gen, prev := e.swap(p)
	e.p.logf("%s apply %s %s", e.role, label.Phase, p.Mode)
	return controller.Transition{
		Time: time.Now(), Environment: e.id, Phase: label.Phase, FromMode: from, ToMode: p.Mode,
		Digest: p.Digest(), Generation: gen, Duration: time.Millisecond,
		Parts: map[string]time.Duration{"rules": time.Millisecond}, OK: true, PreviousBlocked: prev,
		PreviousDropped: dropped,
	}, nil
}

// swap puts p in force as a new generation; it returns that generation and, when the
// provider is set to report it, the ended generation's summary.
func (e *Env) swap(p policy.Policy) (uint64, *adminapi.BlockedSummary) {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev := e.summary()
	e.policy, e.gen, e.blocked = p, e.gen+1, 0
	if !e.p.ReportPrevious {
		return e.gen, nil
	}
	return e.gen, &prev
}

// Exec runs one command of the fake's command language.
func (e *Env) Exec(ctx context.Context, cmd []string, opts controller.ExecOptions) (controller.ExecResult, error) {
	mode := e.Mode()
	note := ""
	if v, ok := opts.Env[controller.NoticeEnv]; ok {
		note = " notice=" + strconv.Quote(v)
	}
	e.p.logf("%s exec %v mode=%s%s", e.role, cmd, mode, note)
	if len(cmd) == 0 {
		return controller.ExecResult{}, errors.New("fake: empty command")
	}
	arg := func() int {
		if len(cmd) < 2 {
			return 0
		}
		n, _ := strconv.Atoi(cmd[1])
		return n
	}
	switch cmd[0] {
	case "exit":
		return controller.ExecResult{ExitCode: arg(), Stdout: []byte("exiting\n")}, nil
	case "hang":
		<-ctx.Done()
		return controller.ExecResult{}, ctx.Err()
	case "unkillable":
		<-ctx.Done()
		return controller.ExecResult{}, fmt.Errorf("%w: %w", ctx.Err(), controller.ErrCommandNotStopped)
	case "panic":
		panic("fake: command panicked")
	case "blocked":
		e.mu.Lock()
		e.blocked += uint64(arg())
		e.mu.Unlock()
	case "dropped":
		e.mu.Lock()
		e.dropped += uint64(arg())
		e.mu.Unlock()
	case "cancel":
		e.p.Cancel()
	case "stdout":
		return controller.ExecResult{Stdout: []byte(strings.Join(cmd[1:], " "))}, nil
	case "stderr":
		return controller.ExecResult{Stderr: []byte(strings.Join(cmd[1:], " "))}, nil
	}
	return controller.ExecResult{Stdout: []byte(fmt.Sprintf(`{"cmd":%q}`+"\n", cmd[0]))}, nil
}

// Download writes a small file standing for srcPath, unless the path is Missing.
func (e *Env) Download(_ context.Context, srcPath, dstDir string) error {
	if e.p.DownloadErr != nil {
		if err := e.p.DownloadErr(); err != nil {
			return err
		}
	}
	if e.p.Missing[srcPath] {
		e.p.logf("%s download %s missing", e.role, srcPath)
		return fmt.Errorf("fake: %s: no such file", srcPath)
	}
	e.p.logf("%s download %s mode=%s", e.role, srcPath, e.Mode())
	return os.WriteFile(filepath.Join(dstDir, filepath.Base(srcPath)), []byte("artifact "+srcPath), 0o644)
}

// Upload notes that a host file was copied in.
func (e *Env) Upload(_ context.Context, srcPath, dstDir string) error {
	if e.p.UploadErr != nil {
		if err := e.p.UploadErr(); err != nil {
			return err
		}
	}
	if _, err := os.Stat(srcPath); err != nil {
		return err
	}
	e.mu.Lock()
	e.files[filepath.Join(dstDir, filepath.Base(srcPath))] = srcPath
	e.mu.Unlock()
	e.p.logf("%s upload %s mode=%s", e.role, filepath.Join(dstDir, filepath.Base(srcPath)), e.Mode())
	return nil
}

// Blocked reports the blocked attempts of the generation in force; like a call to the
// sidecar, it fails once its context has ended.
func (e *Env) Blocked(ctx context.Context) (adminapi.BlockedSummary, error) {
	if err := ctx.Err(); err != nil {
		return adminapi.BlockedSummary{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.summary(), nil
}

// TakeDropped takes the drops counted since the last switch, as the Docker provider's
// transparent path does (controller.DropCounter).
func (e *Env) TakeDropped(ctx context.Context) (controller.Drops, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return e.takeDropped(), nil
}

func (e *Env) takeDropped() controller.Drops {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dropped == 0 {
		return nil
	}
	d := controller.Drops{"udp": {Packets: e.dropped}}
	e.dropped = 0
	return d
}

// summary is the blocked summary of the generation in force; e.mu is held.
func (e *Env) summary() adminapi.BlockedSummary {
	sum := adminapi.BlockedSummary{Generation: e.gen, Total: e.blocked}
	if e.blocked > 0 {
		sum.Top = []adminapi.BlockedTarget{{Host: "exfil.test", Port: 443, Type: "connect", Reason: "not_allowed", Count: e.blocked}}
	}
	return sum
}

// Close removes the environment, or keeps it when retained. Like an engine call, it
// fails once its context has ended.
func (e *Env) Close(ctx context.Context, retain bool) error {
	if e.p.CloseErr != nil {
		if err := e.p.CloseErr(e.role); err != nil {
			e.p.logf("%s close failed", e.role)
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		e.p.logf("%s close failed: %v", e.role, err)
		return err
	}
	e.p.logf("%s close retain=%t mode=%s", e.role, retain, e.Mode())
	if !retain {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
	}
	return nil
}
