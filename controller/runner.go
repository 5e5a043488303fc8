package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// PhaseNotStopped labels the switch to no-network that replaces the restore of a
// baseline when an evaluate command that was cut could not be stopped. It is a label of
// that switch in records, not a policy field.
const PhaseNotStopped = "command_not_stopped"

// PhasePolicies are a task's effective policies, as the planner resolved them.
type PhasePolicies struct {
	Baseline   policy.Policy `json:"baseline"`
	Run        policy.Policy `json:"run"`
	Evaluation policy.Policy `json:"evaluation"`
	// EvaluationBaseline is the evaluation environment's baseline (fresh mode only). It
	// is left out of the JSON when unset, as in shared mode, where the zero policy has
	// no wire form and would leave the task without a digest.
	EvaluationBaseline policy.Policy `json:"evaluation_baseline,omitzero"`
}

// TaskRun is everything the runner needs for one task's lifecycle: the planner's
// effective policies and the commands of each step.
type TaskRun struct {
	ID              string                `json:"task_id"`
	Mode            policy.EvaluationMode `json:"evaluation_mode"`
	Image           string                `json:"image"`
	EvaluationImage string                `json:"evaluation_image,omitempty"`
	Policies        PhasePolicies         `json:"policies"`
	// Plan is the planner's resolved plan (sources, applied recipes, mode summaries),
	// copied into the record as it is.
	Plan json.RawMessage `json:"plan,omitempty"`
	// Notice is the restriction statement of the effective run policy ("" for public).
	Notice        string                    `json:"notice,omitempty"`
	InjectNotice  bool                      `json:"inject_network_restriction_notice"`
	Prepare       []lifecycle.Command       `json:"prepare,omitempty"`
	Harness       *lifecycle.HarnessSession `json:"harness,omitempty"`
	Run           []lifecycle.Command       `json:"run,omitempty"`
	Collect       []lifecycle.Command       `json:"collect,omitempty"`
	Artifacts     []string                  `json:"artifacts,omitempty"`
	SaveArtifacts bool                      `json:"save_artifacts"`
	Evaluate      []lifecycle.Command       `json:"evaluate,omitempty"`
	Retain        bool                      `json:"retain"`
	// Timeouts bounds steps by name; a step without an entry is bounded only by the run.
	Timeouts          map[lifecycle.StepName]time.Duration `json:"timeouts,omitempty"`
	Env               map[string]string                    `json:"env,omitempty"`
	ProxyStartTimeout time.Duration                        `json:"proxy_start_timeout,omitempty"`
}

// Digest identifies the task's definition, so that --resume refuses a record made from a
// different definition.
func (t TaskRun) Digest() string {
	b, err := json.Marshal(t)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Uploader is implemented by environments that can receive files from the host. The
// runner uses it to hand saved artifacts to a fresh evaluation environment.
type Uploader interface {
	Upload(ctx context.Context, srcPath, dstDir string) error
}

// Reacher is implemented by environments that can tell an operator how to reach a
// retained environment.
type Reacher interface {
	Reach() string
}

// Reattacher is implemented by providers that can take an environment left by another
// process (a crashed run) back under control, so that --resume can close it. An error
// that means the environment no longer exists wraps ErrEnvironmentGone; any other leaves
// the environment's fate unknown.
type Reattacher interface {
	Reattach(ctx context.Context, task string, role lifecycle.Role) (Environment, error)
}

// Remover is implemented by providers that can remove whatever exists of a task's
// environment of a role, however far the open that began it got: a half-finished open
// may have no enforcement point to reattach, only objects under the environment's name.
// It returns the environment's ID.
type Remover interface {
	RemoveEnvironment(ctx context.Context, task string, role lifecycle.Role) (string, error)
}

// ErrEnvironmentGone is what a Reattacher's error wraps when there is nothing to reattach.
var ErrEnvironmentGone = errors.New("controller: environment no longer exists")

// TaskLocker is implemented by providers whose environments other processes can reach
// by task ID (a second run of the same task into another output directory, on the same
// host). The runner holds a task's lock for the task's whole life, from before its first
// open or removal of a leftover until after its last close, so that such a run never
// collides with this one's environments, nor removes or reattaches them as its own.
type TaskLocker interface {
	// LockTask takes the task's run lock, or fails at once, with an error that wraps
	// ErrTaskLocked and names the lock, while another process holds it. The lock is the
	// process's: it goes when the process dies, so the resume of a killed run takes it.
	LockTask(ctx context.Context, task string) (unlock func(), err error)
}

// ErrTaskLocked is what a TaskLocker's error wraps when another process holds the task.
var ErrTaskLocked = errors.New("another compassctl run holds the task")

// Runner runs task lifecycles against one provider and writes their records.
type Runner struct {
	Provider Provider
	// OutDir holds one directory per task: run_info.json, notice.txt, logs, artifacts.
	OutDir   string
	Progress Progress
	Logger   *slog.Logger
	// BlockedPollInterval is how often a running step's blocked count is refreshed for
	// the progress display; zero turns polling off.
	BlockedPollInterval time.Duration
	// ControlTimeout bounds a switch, a close and a blocked-count query made after the
	// run was cancelled (restoring a baseline must not wait for ever).
	ControlTimeout time.Duration
}

// Outcome is what a run of one task returned.
type Outcome struct {
	Task   string
	Record *Record
	Err    error
}

// RunAll runs every task with at most concurrency of them at once. Each task has its own
// environments and record; one task's failure does not stop the others.
func (r *Runner) RunAll(ctx context.Context, tasks []TaskRun, concurrency int, resume map[string]*Record) []Outcome {
	if concurrency < 1 {
		concurrency = 1
	}
	out := make([]Outcome, len(tasks))
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
			}
			// Once the run is cancelled no task starts, whichever case the select chose.
			if ctx.Err() != nil {
				rec, err := r.notStarted(t, resume[t.ID], ctx.Err())
				out[i] = Outcome{Task: t.ID, Record: rec, Err: err}
				return
			}
			rec, err := r.RunTask(ctx, t, resume[t.ID])
			out[i] = Outcome{Task: t.ID, Record: rec, Err: err}
		}()
	}
	wg.Wait()
	return out
}

func (r *Runner) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (r *Runner) controlTimeout() time.Duration {
	if r.ControlTimeout > 0 {
		return r.ControlTimeout
	}
	return 2 * time.Minute
}

func (r *Runner) progress() Progress {
	if r.Progress != nil {
		return r.Progress
	}
	return nopProgress{}
}
