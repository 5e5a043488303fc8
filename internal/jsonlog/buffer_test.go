package jsonlog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeRecorder keeps each Write it is given as one element.
type writeRecorder struct {
	mu     sync.Mutex
	writes []string
	err    error
}

func newWriteRecorder() *writeRecorder { return &writeRecorder{} }

func (r *writeRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return 0, r.err
	}
	r.writes = append(r.writes, string(p))
	return len(p), nil
}

func (r *writeRecorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.writes...)
}

// hangGuard bounds a wait for a write the timer must make: far above any time a slow or
// loaded machine plausibly takes, so that reaching it means the write never came.
const hangGuard = 30 * time.Second

// waitWritten waits until the writes hold want, in order, and returns them.
func (r *writeRecorder) waitWritten(t *testing.T, want string) []string {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		got := r.got()
		if strings.Join(got, "") == want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes %q %v on, want %q", got, hangGuard, want)
		}
	}
}

// Lines are held until the delay after the first of a batch has passed, then written
// together. Only lower bounds are timed: the lines can share a batch only if they all
// came within the delay, which a stalled machine may not give, so the test measures
// that and asserts one batch, and nothing written yet, only when they did.
func TestBufferedWriterBatchesUntilTheDelay(t *testing.T) {
	rec := newWriteRecorder()
	const delay = 50 * time.Millisecond
	b := NewBufferedWriter(rec, delay, 1<<10)
	defer b.Close()
	start := time.Now()
	for i := range 3 {
		if n, err := fmt.Fprintf(b, "line %d\n", i); err != nil || n != 7 {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}
	// The timer starts at the first Write, after start: if this much is less than the
	// delay, it has not fired yet.
	got, inTime := rec.got(), time.Since(start) < delay
	if inTime && len(got) != 0 {
		t.Fatalf("written before the delay: %q", got)
	}
	got = rec.waitWritten(t, "line 0\nline 1\nline 2\n")
	if waited := time.Since(start); waited < delay {
		t.Errorf("written after %v, before the delay %v", waited, delay)
	}
	if inTime && len(got) != 1 {
		t.Fatalf("writes %q, want the three lines in one", got)
	}
	// The next line starts a new batch, with its own timer.
	fmt.Fprint(b, "line 3\n")
	if got := rec.waitWritten(t, "line 0\nline 1\nline 2\nline 3\n"); got[len(got)-1] != "line 3\n" {
		t.Fatalf("writes %q, want line 3 in a batch of its own", got)
	}
}

func TestBufferedWriterSizeBoundsABatch(t *testing.T) {
	rec := newWriteRecorder()
	b := NewBufferedWriter(rec, time.Hour, 16)
	for _, line := range []string{"aaaaaa\n", "bbbbbb\n", "cccccc\n", strings.Repeat("L", 20) + "\n", "dd\n"} {
		if _, err := b.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	// The third line would pass 16 bytes: the first two go first. The long line is
	// written on its own, after what was buffered before it.
	want := []string{"aaaaaa\nbbbbbb\n", "cccccc\n", strings.Repeat("L", 20) + "\n"}
	if got := rec.got(); !slices.Equal(got, want) {
		t.Fatalf("writes %q, want %q", got, want)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	want = append(want, "dd\n")
	if got := rec.got(); !slices.Equal(got, want) {
		t.Fatalf("after Close: writes %q, want %q", got, want)
	}
	// After Close, a line goes straight through.
	fmt.Fprint(b, "late\n")
	if got := rec.got(); got[len(got)-1] != "late\n" {
		t.Fatalf("a line after Close was not written: %q", got)
	}
}

func TestBufferedWriterFlush(t *testing.T) {
	rec := newWriteRecorder()
	b := NewBufferedWriter(rec, time.Hour, 1<<10)
	defer b.Close()
	fmt.Fprint(b, "one\n")
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := rec.got(); !slices.Equal(got, []string{"one\n"}) {
		t.Fatalf("writes %q", got)
	}
	if err := b.Flush(); err != nil || len(rec.got()) != 1 {
		t.Fatalf("an empty Flush wrote: %q, %v", rec.got(), err)
	}
}

func TestBufferedWriterReportsTheErrorOfTheWriteItSetOff(t *testing.T) {
	for _, c := range []struct {
		name     string
		buffered string // before the write fails
		line     string
	}{
		{"flush of the batch", "12345\n", "678\n"},
		{"a long line on its own", "", "123456789\n"},
		{"flush before a long line", "12345\n", "123456789\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := newWriteRecorder()
			b := NewBufferedWriter(rec, time.Hour, 8)
			defer b.Close()
			fmt.Fprint(b, c.buffered)
			rec.err = errors.New("disk full")
			if _, err := b.Write([]byte(c.line)); err == nil || !strings.Contains(err.Error(), "disk full") {
				t.Fatalf("Write that set off a failed write: %v", err)
			}
		})
	}
}

// Lines from many goroutines through the slog handler arrive whole, each once.
func TestBufferedWriterKeepsConcurrentLinesWhole(t *testing.T) {
	var out bytes.Buffer
	b := NewBufferedWriter(&out, time.Millisecond, 256)
	log := slog.New(NewHandler(b, nil))
	const workers, lines = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range lines {
				log.Info("decision", "worker", w, "i", i, "host", strings.Repeat("h", i%50))
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if !strings.HasPrefix(l, `{"time":`) || !strings.HasSuffix(l, `"}`) {
			t.Fatalf("broken line %q", l)
		}
		key := l[strings.Index(l, `"worker"`):strings.Index(l, `,"host"`)]
		if seen[key] {
			t.Fatalf("line %s twice", key)
		}
		seen[key] = true
	}
	if len(seen) != workers*lines {
		t.Fatalf("%d lines, want %d", len(seen), workers*lines)
	}
}

// A flush that fails (a transient error on stderr) loses its batch, as unbuffered writes
// of those lines would have; the line whose size set it off is kept for the next write.
func TestBufferedWriterKeepsTheLineAfterAFailedFlush(t *testing.T) {
	rec := newWriteRecorder()
	b := NewBufferedWriter(rec, time.Hour, 8)
	fmt.Fprint(b, "12345\n")
	rec.err = errors.New("transient")
	if _, err := b.Write([]byte("678\n")); err == nil {
		t.Fatal("the failed flush was not reported")
	}
	rec.err = nil
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := rec.got(); !slices.Equal(got, []string{"678\n"}) {
		t.Fatalf("writes %q, want the line that set off the failed flush", got)
	}
}

// Through this package's handler, lines at WARN and above (denied decisions, errors)
// are written at once, with whatever was batched before them and in order; INFO lines
// wait for the batch. A proxy killed outright so loses only INFO lines.
func TestBufferedWriterWritesWarningsAtOnce(t *testing.T) {
	rec := newWriteRecorder()
	b := NewBufferedWriter(rec, time.Hour, 1<<10)
	defer b.Close()
	log := slog.New(NewHandler(b, nil))
	log.Info("allowed", "n", 1)
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("an INFO line was written at once: %q", got)
	}
	log.Warn("denied", "n", 2)
	got := rec.got()
	if len(got) != 1 || !strings.Contains(got[0], `"msg":"allowed"`) || !strings.HasSuffix(got[0], `"msg":"denied","n":2}`+"\n") {
		t.Fatalf("writes %q, want the INFO line then the WARN line in one write", got)
	}
	// The slow path (an attribute the fast encoder does not take) too.
	log.Error("failed", "err", errors.New("boom"))
	if got := rec.got(); len(got) != 2 || !strings.Contains(got[1], `"msg":"failed"`) {
		t.Fatalf("writes %q, want the ERROR line written at once", got)
	}
}

// failingFlusher is a batching writer whose Write and Flush fail as told.
type failingFlusher struct{ writeErr, flushErr error }

func (f *failingFlusher) Write(p []byte) (int, error) { return len(p), f.writeErr }
func (f *failingFlusher) Flush() error                { return f.flushErr }

// A WARN record reports its own write's error first, and the flush's when the write
// succeeded; an INFO record is not flushed, so only its write's error counts.
func TestHandleReportsWriteThenFlushError(t *testing.T) {
	werr, ferr := errors.New("write"), errors.New("flush")
	for _, c := range []struct {
		name               string
		level              slog.Level
		writeErr, flushErr error
		want               error
	}{
		{"warn, both fail", slog.LevelWarn, werr, ferr, werr},
		{"warn, write fails", slog.LevelWarn, werr, nil, werr},
		{"warn, flush fails", slog.LevelWarn, nil, ferr, ferr},
		{"warn, neither", slog.LevelWarn, nil, nil, nil},
		{"info, flush fails", slog.LevelInfo, nil, ferr, nil},
		{"info, write fails", slog.LevelInfo, werr, ferr, werr},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := NewHandler(&failingFlusher{c.writeErr, c.flushErr}, nil)
			r := slog.NewRecord(time.Time{}, c.level, "m", 0)
			if err := h.Handle(t.Context(), r); err != c.want {
				t.Errorf("Handle: %v, want %v", err, c.want)
			}
			if err := LogAttrs(t.Context(), h, time.Time{}, c.level, "m"); err != c.want {
				t.Errorf("LogAttrs: %v, want %v", err, c.want)
			}
		})
	}
}

// A batch holds up to exactly size bytes, and a line of exactly size bytes is batched
// like any other: only passing size sets off a write.
func TestBufferedWriterSizeIsInclusive(t *testing.T) {
	for _, c := range []struct {
		name  string
		lines []string
		want  []string // written before Close
	}{
		{"two lines fill the batch", []string{"123\n", "567\n"}, nil},
		{"one line fills the batch", []string{"1234567\n"}, nil},
		{"after a line, one that fills the next batch", []string{"1\n", "1234567\n"}, []string{"1\n"}},
		{"one byte over", []string{"123\n", "5678\n"}, []string{"123\n"}},
		{"a line one byte over", []string{"12345678\n"}, []string{"12345678\n"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := newWriteRecorder()
			b := NewBufferedWriter(rec, time.Hour, 8)
			defer b.Close()
			for _, l := range c.lines {
				if _, err := b.Write([]byte(l)); err != nil {
					t.Fatal(err)
				}
			}
			if got := rec.got(); !slices.Equal(got, c.want) {
				t.Fatalf("writes %q, want %q", got, c.want)
			}
		})
	}
}

// The timer is armed once per batch, by its first line, and the timer's flush disarms
// it: a line that re-armed it would push the batch's write back, and a steady trickle
// of lines would then hold every one of them.
func TestBufferedWriterArmsOncePerBatch(t *testing.T) {
	rec := newWriteRecorder()
	b := NewBufferedWriter(rec, time.Hour, 1<<10)
	defer b.Close()
	armed := func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.armed }
	if armed() {
		t.Fatal("armed before any line")
	}
	fmt.Fprint(b, "one\n")
	if !armed() {
		t.Fatal("the first line of a batch did not arm the timer")
	}
	b.flushLater()
	if armed() || !slices.Equal(rec.got(), []string{"one\n"}) {
		t.Fatalf("after the timer's flush: armed %v, writes %q", armed(), rec.got())
	}
	fmt.Fprint(b, "two\n")
	if !armed() {
		t.Fatal("the next batch's first line did not arm the timer")
	}
}
