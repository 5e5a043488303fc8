package controller

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// ProgressUpdate is the state of one task as the progress display shows it.
type ProgressUpdate struct {
	Task    string
	Step    lifecycle.StepName
	Mode    policy.Mode // the mode in force in the environment the step runs in
	Started time.Time   // when the task started
	Blocked uint64      // blocked attempts so far, every phase
	Done    bool
	Ended   time.Time // when the task finished (Done)
	Status  TaskStatus
}

// Progress receives task updates from the runner (from several goroutines).
type Progress interface {
	Update(ProgressUpdate)
}

type nopProgress struct{}

func (nopProgress) Update(ProgressUpdate) {}

// LogProgress writes one plain line per phase change: for logs and pipes.
type LogProgress struct {
	mu   sync.Mutex
	w    io.Writer
	last map[string]ProgressUpdate
	now  func() time.Time
}

// NewLogProgress writes plain progress lines to w.
func NewLogProgress(w io.Writer) *LogProgress {
	return &LogProgress{w: w, last: map[string]ProgressUpdate{}, now: time.Now}
}

// Update writes a line when the task's step, mode or end state changed.
func (p *LogProgress) Update(u ProgressUpdate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	prev, seen := p.last[u.Task]
	p.last[u.Task] = u
	if seen && prev.Step == u.Step && prev.Mode == u.Mode && prev.Done == u.Done {
		return
	}
	fmt.Fprintf(p.w, "%s %s\n", p.now().UTC().Format(time.RFC3339), progressLine(u, p.now()))
}

// LiveProgress redraws one line per task in place on a terminal.
type LiveProgress struct {
	mu    sync.Mutex
	w     io.Writer
	order []string
	state map[string]ProgressUpdate
	drawn int // lines drawn last time, to move the cursor back over them
	stop  chan struct{}
	done  chan struct{}
	now   func() time.Time
}

// NewLiveProgress starts redrawing on w every interval until Stop.
func NewLiveProgress(w io.Writer, interval time.Duration) *LiveProgress {
	p := &LiveProgress{w: w, state: map[string]ProgressUpdate{}, stop: make(chan struct{}),
		done: make(chan struct{}), now: time.Now}
	go p.loop(interval)
	return p
}

// Update records the task's state for the next redraw.
func (p *LiveProgress) Update(u ProgressUpdate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.state[u.Task]; !ok {
		p.order = append(p.order, u.Task)
	}
	p.state[u.Task] = u
}

// Stop draws the final state and ends the redraw loop.
func (p *LiveProgress) Stop() {
	close(p.stop)
	<-p.done
}

func (p *LiveProgress) loop(interval time.Duration) {
	defer close(p.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.draw()
		case <-p.stop:
			p.draw()
			return
		}
	}
}

func (p *LiveProgress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.drawn)
	}
	now := p.now()
	for _, task := range p.order {
		b.WriteString("\x1b[2K")
		b.WriteString(progressLine(p.state[task], now))
		b.WriteByte('\n')
	}
	p.drawn = len(p.order)
	io.WriteString(p.w, b.String())
}

func progressLine(u ProgressUpdate, now time.Time) string {
	step := string(u.Step)
	if u.Done {
		step = "done: " + string(u.Status)
	}
	mode := string(u.Mode)
	if mode == "" {
		mode = "-"
	}
	if u.Done && !u.Ended.IsZero() {
		now = u.Ended
	}
	elapsed := now.Sub(u.Started).Truncate(100 * time.Millisecond)
	return fmt.Sprintf("task=%s phase=%s mode=%s elapsed=%s blocked=%d", u.Task, step, mode, elapsed, u.Blocked)
}
