package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// RecordVersion is the run_info.json format version.
const RecordVersion = 1

// RecordFile is the record's name inside a task's output directory.
const RecordFile = "run_info.json"

// TaskStatus is where a task's lifecycle stands.
type TaskStatus string

const (
	StatusRunning   TaskStatus = "running"   // in progress, or the runner died (see --resume)
	StatusSucceeded TaskStatus = "succeeded" // every step ran and exited 0
	StatusFailed    TaskStatus = "failed"    // a step failed, timed out, or a switch failed
	StatusCancelled TaskStatus = "cancelled" // stopped by Ctrl-C / SIGTERM
	// StatusRefused: nothing of the task ran or was touched, because the runner could not
	// take its run lock (TaskLocker: another process holds it); --resume runs it from
	// the start.
	StatusRefused TaskStatus = "refused"
)

// StepStatus is how one lifecycle step ended.
type StepStatus string

const (
	StepRunning   StepStatus = "running"
	StepOK        StepStatus = "ok"
	StepFailed    StepStatus = "failed"    // a command exited non-zero
	StepTimedOut  StepStatus = "timed_out" // the step's timeout expired
	StepCancelled StepStatus = "cancelled" // the run was cancelled during the step
	StepError     StepStatus = "error"     // the environment failed (exec, switch, open, close)
	StepCrashed   StepStatus = "crashed"   // the runner panicked or died during the step
	StepSkipped   StepStatus = "skipped"   // the step's condition does not hold
)

// EnvState is what became of an environment.
type EnvState string

const (
	EnvOpen     EnvState = "open"
	EnvClosed   EnvState = "closed"
	EnvRetained EnvState = "retained"
)

// Record is run_info.json: the evidence of what one task's lifecycle did, under which
// policy, and what was blocked. It is rewritten atomically after every change.
type Record struct {
	Version        int                   `json:"version"`
	Task           string                `json:"task_id"`
	TaskDigest     string                `json:"task_digest"`
	EvaluationMode policy.EvaluationMode `json:"evaluation_mode"`
	Status         TaskStatus            `json:"status"`
	Error          string                `json:"error,omitempty"`
	Started        time.Time             `json:"started"`
	Ended          *time.Time            `json:"ended,omitempty"`
	// Phase is the step in progress, or the last one reached.
	Phase        lifecycle.StepName       `json:"phase"`
	Plan         json.RawMessage          `json:"plan,omitempty"`
	Policies     map[string]policy.Policy `json:"policies"`
	NetworkModes map[string]policy.Mode   `json:"network_modes"`
	Notice       NoticeRecord             `json:"notice"`
	Environments []EnvRecord              `json:"environments"`
	Transitions  []Transition             `json:"transitions"`
	Steps        []StepRecord             `json:"steps"`
	Blocked      []PhaseBlocked           `json:"blocked"`
	Artifacts    []ArtifactRecord         `json:"artifacts"`
	Resumes      []ResumeRecord           `json:"resumes,omitempty"`
}

// NoticeRecord says whether the restriction statement was written for the harness.
type NoticeRecord struct {
	Injected bool   `json:"injected"`
	Path     string `json:"path,omitempty"`
	Reason   string `json:"reason,omitempty"` // why not, when not injected
}

// EnvRecord is one environment of the task.
type EnvRecord struct {
	ID    string         `json:"id"`
	Role  lifecycle.Role `json:"role"`
	Image string         `json:"image"`
	State EnvState       `json:"state"`
	Reach string         `json:"reach,omitempty"` // how to reach a retained environment
}

// StepRecord is one lifecycle step.
type StepRecord struct {
	Name        lifecycle.StepName `json:"name"`
	Environment string             `json:"environment,omitempty"`
	Phase       string             `json:"phase"` // the policy field in force
	Mode        policy.Mode        `json:"mode"`
	Start       time.Time          `json:"start"`
	End         *time.Time         `json:"end,omitempty"`
	Duration    time.Duration      `json:"duration_ns"`
	Status      StepStatus         `json:"status"`
	ExitCode    *int               `json:"exit_code,omitempty"`
	TimedOut    bool               `json:"timed_out"`
	Reason      string             `json:"reason,omitempty"` // why skipped
	Error       string             `json:"error,omitempty"`
	Log         string             `json:"log,omitempty"` // path relative to the task directory
	Commands    []CommandRecord    `json:"commands,omitempty"`
}

// CommandRecord is one command of a step.
type CommandRecord struct {
	Argv     []string      `json:"argv"`
	ExitCode *int          `json:"exit_code,omitempty"`
	Duration time.Duration `json:"duration_ns"`
	Error    string        `json:"error,omitempty"`
}

// PhaseBlocked is the blocked-egress summary of one policy phase of one environment,
// taken just before the policy changed (or the environment closed).
type PhaseBlocked struct {
	Environment string                  `json:"environment"`
	Phase       string                  `json:"phase"`
	Mode        policy.Mode             `json:"mode"`
	Summary     adminapi.BlockedSummary `json:"summary"`
	// Dropped is what the transparent path dropped in the phase, when it had one.
	Dropped Drops  `json:"dropped,omitempty"`
	Error   string `json:"error,omitempty"`
}

// ArtifactRecord is one declared artifact path.
type ArtifactRecord struct {
	Path  string `json:"path"`
	Saved bool   `json:"saved"`
	Local string `json:"local,omitempty"` // path relative to the task directory
	Error string `json:"error,omitempty"`
}

// ResumeRecord notes a --resume of this task.
type ResumeRecord struct {
	Time time.Time          `json:"time"`
	From lifecycle.StepName `json:"from"`
}

// BlockedTotal is the number of blocked attempts over every recorded phase.
func (r *Record) BlockedTotal() uint64 {
	var n uint64
	for _, b := range r.Blocked {
		n += b.Summary.Total
	}
	return n
}

// ReadRecord loads a task's record from its output directory.
func ReadRecord(taskDir string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(taskDir, RecordFile))
	if err != nil {
		return nil, fmt.Errorf("controller: read record: %w", err)
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("controller: read record %s: %w", filepath.Join(taskDir, RecordFile), err)
	}
	return &rec, nil
}

// recorder owns one task's record and rewrites it after every change, so that a runner
// that dies leaves the record as of its last completed change.
type recorder struct {
	mu   sync.Mutex
	rec  Record
	path string
	err  error // the first write failure, reported when the task ends
}

func newRecorder(dir string, rec Record) (*recorder, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("controller: create task directory: %w", err)
	}
	r := &recorder{rec: rec, path: filepath.Join(dir, RecordFile)}
	r.update(func(*Record) {})
	return r, r.err
}

// update changes the record under the lock and writes it.
func (r *recorder) update(change func(*Record)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	change(&r.rec)
	if err := writeFileAtomic(r.path, &r.rec); err != nil && r.err == nil {
		r.err = err
	}
}

// snapshot returns a deep copy of the record.
func (r *recorder) snapshot() *Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cloneRecord(&r.rec)
}

// cloneRecord is a deep copy of rec, through its JSON form: what a reader of the file
// would get.
func cloneRecord(rec *Record) *Record {
	b, err := json.Marshal(rec)
	if err != nil {
		return nil
	}
	var out Record
	if err := json.Unmarshal(b, &out); err != nil {
		return nil
	}
	return &out
}

func (r *recorder) writeErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// writeFileAtomic writes v as indented JSON next to path and renames it into place, so
// a reader never sees a half-written record.
func writeFileAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("controller: encode record: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".run_info-*.tmp")
	if err != nil {
		return fmt.Errorf("controller: write record: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	// Readable by others, as a file the runner creates usually is (CreateTemp makes it
	// 0600): whoever reads the step logs and artifacts reads the record too.
	merr := tmp.Chmod(0o644)
	cerr := tmp.Close()
	if err := errors.Join(werr, merr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("controller: write record: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("controller: write record: %w", err)
	}
	return nil
}
