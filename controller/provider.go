// Package controller holds what every provider shares: the environment and provider
// interfaces, phases and the task lifecycle, and the transition records that prove which
// policy was in force when.
package controller

import (
	"context"
	"errors"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// EnvSpec is what a provider needs to open one environment.
type EnvSpec struct {
	Task  string            // task ID, unique among the tasks a controller manages
	Role  lifecycle.Role    // agent or evaluation
	Image string            // container image, present locally
	Env   map[string]string // extra environment variables for the container
	Cmd   []string          // the container's command; empty: the image's default
	// Baseline is the policy in force from the moment the environment can run anything.
	Baseline policy.Policy
	// ProxyStartTimeout bounds how long the enforcement point may take to become ready.
	ProxyStartTimeout time.Duration
}

// Provider opens environments on one kind of infrastructure.
type Provider interface {
	Name() string
	// Open creates the environment with spec.Baseline in force, or creates nothing.
	Open(ctx context.Context, spec EnvSpec) (Environment, error)
}

// PhaseLabel names the lifecycle phase a policy is applied for, so that logs, metrics
// and transition records can say which phase a decision belonged to.
type PhaseLabel struct {
	Phase string // "baseline", "run", "evaluation", "evaluation_baseline", or a user label
}

// Environment is one opened sandbox.
type Environment interface {
	// ID is the environment's name, unique on the host ("<task>" or "<task>-eval").
	ID() string
	// Apply puts p in force and returns only when the enforcement point has acknowledged
	// it and the wiring matches its mode. On error the environment has no egress at all,
	// and so it has when Apply panics.
	Apply(ctx context.Context, p policy.Policy, label PhaseLabel) (Transition, error)
	// Exec runs cmd inside the environment. When ctx cuts the command and the command
	// may still be running, the error wraps ErrCommandNotStopped.
	Exec(ctx context.Context, cmd []string, opts ExecOptions) (ExecResult, error)
	// Download copies srcPath (a file or directory inside the environment) into dstDir.
	Download(ctx context.Context, srcPath, dstDir string) error
	// Blocked summarises the blocked attempts seen under the policy now in force.
	Blocked(ctx context.Context) (adminapi.BlockedSummary, error)
	// Close removes the environment; with retain it is kept running and only detached
	// from the controller's bookkeeping.
	Close(ctx context.Context, retain bool) error
}

// ErrCommandNotStopped is wrapped by an Exec whose cut command (a timeout, a
// cancellation) could not be stopped. Such a command would run on into the next phase
// under that phase's policy, so its step is an error, which ends the lifecycle, never a
// timeout the lifecycle carries on after.
var ErrCommandNotStopped = errors.New("the cut command may still be running")

// ExecOptions tunes one Exec.
type ExecOptions struct {
	Env     map[string]string
	WorkDir string
}

// ExecResult is the outcome of one Exec.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Transition records one policy switch: the evidence of what was in force when.
type Transition struct {
	Time        time.Time                `json:"time"`
	Task        string                   `json:"task"`
	Environment string                   `json:"environment"`
	Phase       string                   `json:"phase"`
	FromMode    policy.Mode              `json:"from_mode"`
	ToMode      policy.Mode              `json:"to_mode"`
	Digest      string                   `json:"policy_digest"`
	Generation  uint64                   `json:"generation"`
	Duration    time.Duration            `json:"duration_ns"`
	Parts       map[string]time.Duration `json:"parts_ns"` // e.g. "rules", "wiring", "routes"
	OK          bool                     `json:"ok"`
	Error       string                   `json:"error,omitempty"`
	// PreviousBlocked is the summary of the policy generation this switch ended, taken
	// by the enforcement point atomically with the swap; nil when the provider cannot say.
	PreviousBlocked *adminapi.BlockedSummary `json:"previous_blocked,omitempty"`
	// PreviousDropped is what the transparent path dropped (per class: udp, icmp, other,
	// spoofed) during the phase this switch ended, read as the switch takes the path
	// over or removes it; nil when that phase had no transparent path.
	PreviousDropped Drops `json:"previous_dropped,omitempty"`
}

// DropCounter is an Environment whose enforcement point drops what it cannot decide (the
// Docker provider's transparent path). A switch reports the drops of the phase it ends
// (Transition.PreviousDropped); the last phase ends with the close instead, so its drops
// are taken just before, as its blocked summary is read.
type DropCounter interface {
	TakeDropped(ctx context.Context) (Drops, error)
}

// Drops counts the packets an enforcement point dropped, per class.
type Drops map[string]DropCount

// DropCount is one class's dropped packets and bytes.
type DropCount struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}
