package jsonlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var fixedTime = time.Date(2026, 11, 30, 5, 30, 34, 123456789, time.FixedZone("X", 5*3600+30*60))

// both returns what slog.JSONHandler and this package's handler write for r,
// each built with opts and then shaped by derive (WithAttrs, WithGroup, ...).
func both(t testing.TB, opts *slog.HandlerOptions, derive func(slog.Handler) slog.Handler, r slog.Record) (want, got string) {
	t.Helper()
	var wb, gb bytes.Buffer
	var wh slog.Handler = slog.NewJSONHandler(&wb, opts)
	gh := NewHandler(&gb, opts)
	if derive != nil {
		wh, gh = derive(wh), derive(gh)
	}
	if err := wh.Handle(context.Background(), r); err != nil {
		t.Fatalf("slog Handle: %v", err)
	}
	if err := gh.Handle(context.Background(), r); err != nil {
		t.Fatalf("jsonlog Handle: %v", err)
	}
	// LogAttrs, given what r holds, writes what Handle wrote (a record with a PC
	// carries a source LogAttrs has no way to give).
	if r.PC == 0 {
		var lb bytes.Buffer
		lh := NewHandler(&lb, opts)
		if derive != nil {
			lh = derive(lh)
		}
		var attrs []slog.Attr
		r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a); return true })
		if err := LogAttrs(context.Background(), lh, r.Time, r.Level, r.Message, attrs...); err != nil {
			t.Fatalf("jsonlog LogAttrs: %v", err)
		}
		if lb.String() != gb.String() {
			t.Fatalf("LogAttrs wrote\n%s\nHandle wrote\n%s", lb.String(), gb.String())
		}
	}
	return wb.String(), gb.String()
}

type valuer struct{ s string }

func (v valuer) LogValue() slog.Value { return slog.StringValue("resolved:" + v.s) }

type marshaler struct{}

func (marshaler) MarshalJSON() ([]byte, error) { return []byte(`{"m":1}`), nil }

func withAttrs(as ...slog.Attr) func(slog.Handler) slog.Handler {
	return func(h slog.Handler) slog.Handler { return h.WithAttrs(as) }
}

func TestHandlerMatchesSlog(t *testing.T) {
	var pcs [1]uintptr
	runtime.Callers(1, pcs[:])
	tricky := []string{
		"", "plain", `quote " and backslash \`, "<>&", "\u2028 and \u2029",
		"\x00\x01\x1f\x7f", "tab\tnl\nncr\r", "invalid \xff\xfe utf-8", "truncated \xe2\x80",
		"héllo wörld 🚀", "\xed\xa0\x80 surrogate", "ok\u2027\u202a",
	}
	type tc struct {
		name   string
		opts   *slog.HandlerOptions
		derive func(slog.Handler) slog.Handler
		time   time.Time
		level  slog.Level
		msg    string
		attrs  []slog.Attr
		pc     uintptr
	}
	cases := []tc{
		{name: "no attrs", time: fixedTime, msg: "m"},
		{name: "zero time", msg: "m", attrs: []slog.Attr{slog.Int("a", 1)}},
		{name: "nil opts", opts: nil, time: fixedTime, msg: "m", attrs: []slog.Attr{slog.String("a", "b")}},
		{name: "levels", time: fixedTime, level: slog.LevelError + 3, msg: "m"},
		{name: "level below debug", time: fixedTime, level: slog.LevelDebug - 3, msg: "m"},
		{name: "ints", time: fixedTime, msg: "m", attrs: []slog.Attr{
			slog.Int("i", 0), slog.Int64("min", math.MinInt64), slog.Int64("max", math.MaxInt64),
			slog.Uint64("umax", math.MaxUint64), slog.Int("port", 443)}},
		{name: "floats", time: fixedTime, msg: "m", attrs: []slog.Attr{
			slog.Float64("z", 0), slog.Float64("nz", math.Copysign(0, -1)), slog.Float64("f", 123.456),
			slog.Float64("e21", 1e21), slog.Float64("below e21", 999999999999999900000),
			slog.Float64("e-7", 1e-7), slog.Float64("e-6", 1e-6), slog.Float64("neg", -2.5e-300),
			slog.Float64("max", math.MaxFloat64), slog.Float64("tiny", math.SmallestNonzeroFloat64)}},
		{name: "nan and inf", time: fixedTime, msg: "m", attrs: []slog.Attr{
			slog.Float64("nan", math.NaN()), slog.Float64("inf", math.Inf(1)), slog.Float64("ninf", math.Inf(-1))}},
		{name: "bools and durations", time: fixedTime, msg: "m", attrs: []slog.Attr{
			slog.Bool("t", true), slog.Bool("f", false), slog.Duration("d", 1500*time.Millisecond),
			slog.Duration("nd", -time.Nanosecond), slog.Duration("max", math.MaxInt64)}},
		{name: "times", time: fixedTime, msg: "m", attrs: []slog.Attr{
			slog.Time("utc", time.Date(2000, 1, 2, 3, 4, 5, 0, time.UTC)),
			slog.Time("zone", fixedTime), slog.Time("zero", time.Time{}),
			slog.Time("mono", time.Now()),
			slog.Time("far", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)),
			slog.Time("neg", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC))}},
		{name: "record year out of range", time: time.Date(12345, 1, 1, 0, 0, 0, 0, time.UTC), msg: "m"},
		{name: "record time monotonic", time: time.Now(), msg: "m"},
		{name: "empty key", time: fixedTime, msg: "m", attrs: []slog.Attr{slog.String("", ""), slog.Int("", 0)}},
		{name: "duplicate keys", time: fixedTime, msg: "m", attrs: []slog.Attr{slog.String("msg", "x"), slog.String("a", "1"), slog.String("a", "2")}},
		{name: "many attrs", time: fixedTime, msg: "m", attrs: func() []slog.Attr {
			var as []slog.Attr
			for i := range 40 {
				as = append(as, slog.Int(fmt.Sprint("k", i), i))
			}
			return as
		}()},
		{name: "long string", time: fixedTime, msg: strings.Repeat("x", 20000), attrs: []slog.Attr{slog.String("s", strings.Repeat("<\u2028\xff", 3000))}},
		{name: "group attr", time: fixedTime, msg: "m", attrs: []slog.Attr{slog.String("a", "b"), slog.Group("g", slog.Int("x", 1), slog.Group("h", slog.Bool("y", true)))}},
		{name: "empty group", time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Group("g"), slog.Int("a", 1)}},
		{name: "inline group", time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Group("", slog.Int("x", 1))}},
		{name: "log valuer", time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Any("v", valuer{"q"}), slog.Int("a", 1)}},
		{name: "any kinds", time: fixedTime, msg: "m", attrs: []slog.Attr{
			slog.Any("err", errors.New("boom <x>")), slog.Any("nil", nil), slog.Any("slice", []int{1, 2}),
			slog.Any("map", map[string]string{"k": "<v>"}), slog.Any("marshaler", marshaler{}),
			slog.Any("chan", make(chan int))}},
		{name: "empty attr", time: fixedTime, msg: "m", attrs: []slog.Attr{{}, slog.Int("a", 1)}},
		{name: "with attrs", derive: withAttrs(slog.String("task", "t1"), slog.Int("n", 2)), time: fixedTime, msg: "m",
			attrs: []slog.Attr{slog.Bool("b", true)}},
		{name: "with attrs no record attrs", derive: withAttrs(slog.String("task", "t1")), time: fixedTime, msg: "m"},
		{name: "with attrs empty", derive: withAttrs(), time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Int("a", 1)}},
		{name: "with attrs twice", derive: func(h slog.Handler) slog.Handler {
			return h.WithAttrs([]slog.Attr{slog.Int("a", 1)}).WithAttrs([]slog.Attr{slog.Float64("f", math.NaN())})
		}, time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Int("c", 3)}},
		{name: "with attrs group", derive: withAttrs(slog.Group("g", slog.Int("x", 1))), time: fixedTime, msg: "m",
			attrs: []slog.Attr{slog.Int("a", 1)}},
		{name: "with attrs then fast after slow", derive: func(h slog.Handler) slog.Handler {
			return h.WithAttrs([]slog.Attr{slog.Any("v", valuer{"w"})}).WithAttrs([]slog.Attr{slog.Int("a", 1)})
		}, time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Int("c", 3)}},
		{name: "with group", derive: func(h slog.Handler) slog.Handler {
			return h.WithAttrs([]slog.Attr{slog.Int("a", 1)}).WithGroup("g").WithAttrs([]slog.Attr{slog.Int("b", 2)})
		}, time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Int("c", 3)}},
		{name: "with group no attrs", derive: func(h slog.Handler) slog.Handler { return h.WithGroup("g") }, time: fixedTime, msg: "m"},
		{name: "with empty group name", derive: func(h slog.Handler) slog.Handler { return h.WithGroup("") }, time: fixedTime, msg: "m",
			attrs: []slog.Attr{slog.Int("c", 3)}},
		{name: "replace attr", opts: &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			a.Key = strings.ToUpper(a.Key)
			return a
		}}, time: fixedTime, msg: "m", attrs: []slog.Attr{slog.Int("a", 1)}},
		{name: "add source", opts: &slog.HandlerOptions{AddSource: true}, time: fixedTime, msg: "m", pc: pcs[0],
			attrs: []slog.Attr{slog.Int("a", 1)}},
		{name: "add source no pc", opts: &slog.HandlerOptions{AddSource: true}, time: fixedTime, msg: "m"},
	}
	for _, s := range tricky {
		cases = append(cases, tc{name: fmt.Sprintf("string %q", s), time: fixedTime, msg: s,
			attrs: []slog.Attr{slog.String(s, s)}, derive: withAttrs(slog.String(s, s))})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			if opts == nil && c.name != "nil opts" {
				opts = &slog.HandlerOptions{Level: slog.LevelDebug - 10}
			}
			r := slog.NewRecord(c.time, c.level, c.msg, c.pc)
			r.AddAttrs(c.attrs...)
			want, got := both(t, opts, c.derive, r)
			if got != want {
				t.Errorf("output differs\n got: %s\nwant: %s", got, want)
			}
		})
	}
}

func TestEnabled(t *testing.T) {
	var lv slog.LevelVar
	tests := []struct {
		name  string
		opts  *slog.HandlerOptions
		set   slog.Level
		level slog.Level
	}{
		{name: "nil opts info", level: slog.LevelInfo},
		{name: "nil opts debug", level: slog.LevelDebug},
		{name: "static warn", opts: &slog.HandlerOptions{Level: slog.LevelWarn}, level: slog.LevelInfo},
		{name: "dynamic debug", opts: &slog.HandlerOptions{Level: &lv}, set: slog.LevelDebug, level: slog.LevelDebug},
		{name: "dynamic error", opts: &slog.HandlerOptions{Level: &lv}, set: slog.LevelError, level: slog.LevelWarn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lv.Set(tt.set)
			want := slog.NewJSONHandler(io.Discard, tt.opts).Enabled(context.Background(), tt.level)
			h := NewHandler(io.Discard, tt.opts)
			for _, h := range []slog.Handler{h, h.WithAttrs([]slog.Attr{slog.Int("a", 1)}), h.WithGroup("g")} {
				if got := h.Enabled(context.Background(), tt.level); got != want {
					t.Errorf("Enabled(%v) = %v, want %v", tt.level, got, want)
				}
			}
		})
	}
}

// plainBuffer is deliberately unsynchronised: overlapping Write calls show up
// as garbled lines and, under -race, as data races.
type plainBuffer struct{ bytes.Buffer }

func TestConcurrentHandleDoesNotInterleave(t *testing.T) {
	var buf plainBuffer
	root := NewHandler(&buf, nil)
	// Fast and delegated handlers derived from one root share its writer.
	handlers := []slog.Handler{
		root,
		root.WithAttrs([]slog.Attr{slog.String("with", strings.Repeat("w", 100))}),
		root.WithGroup("g"),
		root.WithAttrs([]slog.Attr{slog.Any("v", valuer{"x"})}),
	}
	const goroutines, perGoroutine = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			h := handlers[g%len(handlers)]
			for i := range perGoroutine {
				r := slog.NewRecord(fixedTime, slog.LevelInfo, "decision", 0)
				r.AddAttrs(slog.Int("g", g), slog.Int("i", i), slog.String("pad", strings.Repeat("p", 500)))
				if i%3 == 0 {
					r.AddAttrs(slog.Group("grp", slog.Int("x", i)))
				}
				if err := h.Handle(context.Background(), r); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != goroutines*perGoroutine {
		t.Fatalf("got %d lines, want %d", len(lines), goroutines*perGoroutine)
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("line is not one JSON object: %q", l)
		}
	}
}

func FuzzHandlerMatchesSlog(f *testing.F) {
	f.Add("decision", 0, "host", "example.test", "port", int64(443), uint64(7), 1.5, true, int64(time.Second), int64(1e18), 3600, int64(1), uint8(0))
	f.Add("<>&\u2028", -4, "\xff", "\x00\"\\", "", int64(math.MinInt64), uint64(math.MaxUint64), math.Inf(-1), false, int64(-1), int64(0), -45000, int64(0), uint8(3))
	f.Add("m", 12, "k", "héllo", "k", int64(0), uint64(0), 1e-7, false, int64(0), int64(math.MaxInt64), 0, int64(math.MinInt64), uint8(7))
	f.Add("", 3, "a", "\u2029", "b", int64(-9), uint64(1), 1e21, true, int64(1), int64(-1e18), 86399, int64(253402300800), uint8(5))
	f.Fuzz(func(t *testing.T, msg string, level int, k1, s1, k2 string, i int64, u uint64, fl float64, bl bool,
		d int64, tn int64, zone int, ts int64, nWith uint8) {
		loc := time.FixedZone("Z", zone)
		attrs := []slog.Attr{
			slog.String(k1, s1),
			slog.Int64(k2, i),
			slog.Uint64(k1+"u", u),
			slog.Float64(k2+"f", fl),
			slog.Bool(s1, bl),
			slog.Duration(k1, time.Duration(d)),
			slog.Time(k2, time.Unix(0, tn).In(loc)),
			slog.Time("ts", time.Unix(ts, tn%1e9).In(loc)),
		}
		n := int(nWith) % (len(attrs) + 1)
		var rt time.Time
		if ts != 0 {
			rt = time.Unix(ts, 0).In(loc)
		}
		r := slog.NewRecord(rt, slog.Level(level), msg, 0)
		r.AddAttrs(attrs[n:]...)
		want, got := both(t, &slog.HandlerOptions{Level: slog.Level(math.MinInt)}, withAttrs(attrs[:n]...), r)
		if got != want {
			t.Fatalf("output differs\n got: %q\nwant: %q", got, want)
		}
	})
}

// The proxy's decision lines carry a dozen attributes: written through LogAttrs on
// the fast path they cost no allocation (a record would allocate past the fifth).
func TestLogAttrsDoesNotAllocate(t *testing.T) {
	h := NewHandler(io.Discard, nil)
	now := time.Now()
	if n := testing.AllocsPerRun(100, func() {
		_ = LogAttrs(context.Background(), h, now, slog.LevelInfo, "decision", decisionAttrs...)
	}); n != 0 {
		t.Fatalf("LogAttrs: %v allocations per line, want 0", n)
	}
}
