// Package jsonlog is a faster drop-in for slog's JSONHandler.
//
// compass-proxy writes one JSON log line per decision (every tunnel set-up and
// every HTTP request), so the handler is on the proxy's hot path; profiles put
// slog.JSONHandler at about 7% of the proxy's CPU. The proxy's decision lines
// carry only flat attributes of scalar kinds, which this package encodes
// directly with strconv and a hand-written string escaper into a pooled buffer.
//
// Contract: for every record, options and WithAttrs/WithGroup chain, the bytes
// written are identical to those slog.NewJSONHandler(w, opts) would write. Only
// the common case takes the fast path (no ReplaceAttr, no AddSource, no groups,
// attributes of kind String, Int64, Uint64, Float64, Bool, Duration or Time);
// everything else is delegated to an embedded slog.JSONHandler. Each record is
// written with a single Write call under a mutex shared by both paths, so lines
// never interleave.
package jsonlog

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// handler implements slog.Handler. Values are immutable after construction;
// WithAttrs and WithGroup return new handlers sharing mu and w.
type handler struct {
	slow  slog.Handler // slog's own handler, for everything off the fast path
	level slog.Leveler // nil means slog.LevelInfo, as in slog
	// fast reports whether records may be encoded here: the options allow it
	// and every WithAttrs so far was pre-encodable and no WithGroup was called.
	fast bool
	pre  []byte // pre-encoded WithAttrs attributes, each followed by ','
	mu   *sync.Mutex
	w    io.Writer
	// flusher is w when it batches its writes (BufferedWriter): flushed after every
	// record at WARN or above.
	flusher interface{ Flush() error }
}

// NewHandler returns a handler whose output is byte-for-byte that of
// slog.NewJSONHandler(w, opts). A nil opts means the default options.
func NewHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	if opts == nil {
		opts = &slog.HandlerOptions{}
	}
	mu := &sync.Mutex{}
	h := &handler{
		// The fallback writes under the same mutex as the fast path, so a
		// fast line and a delegated line never overlap in w.
		slow:  slog.NewJSONHandler(&lockedWriter{mu: mu, w: w}, opts),
		level: opts.Level,
		fast:  opts.ReplaceAttr == nil && !opts.AddSource,
		mu:    mu,
		w:     w,
	}
	h.flusher, _ = w.(interface{ Flush() error })
	return h
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool {
	minLevel := slog.LevelInfo
	if h.level != nil {
		minLevel = h.level.Level()
	}
	return l >= minLevel
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h2 := *h
	h2.slow = h.slow.WithAttrs(attrs)
	if h.fast {
		pre := append([]byte(nil), h.pre...)
		for _, a := range attrs {
			var ok bool
			if pre, ok = appendAttr(pre, a); !ok {
				h2.fast = false
				pre = nil
				break
			}
		}
		h2.pre = pre
	}
	return &h2
}

// WithGroup always delegates: slog.JSONHandler opens even a group named ""
// (slog.Logger, not the handler, drops empty names).
func (h *handler) WithGroup(name string) slog.Handler {
	h2 := *h
	h2.slow = h.slow.WithGroup(name)
	h2.fast = false
	h2.pre = nil
	return &h2
}

// bufPool holds encode buffers; like slog it keeps only small ones, so one
// huge line does not pin its buffer forever.
var bufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 1024)
	return &b
}}

const maxPooledBuf = 16 << 10

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	if h.fast {
		bp, b := h.begin(r.Time, r.Level, r.Message)
		ok := true
		r.Attrs(func(a slog.Attr) bool {
			b, ok = appendAttr(b, a)
			return ok
		})
		if ok {
			return h.flushUrgent(r.Level, h.finish(bp, b))
		}
		release(bp, b)
	}
	return h.flushUrgent(r.Level, h.slow.Handle(ctx, r))
}

// flushUrgent flushes a batching writer after a record at WARN or above, so that denied
// decisions and errors are written at once rather than with the next batch, and a
// process killed outright can lose only INFO lines. err is the record's own error.
func (h *handler) flushUrgent(level slog.Level, err error) error {
	if h.flusher == nil || level < slog.LevelWarn {
		return err
	}
	if ferr := h.flusher.Flush(); err == nil {
		err = ferr
	}
	return err
}

// LogAttrs hands h one record of attrs, as Handle(ctx, r) with a record r of t, level,
// msg and attrs would, byte for byte. When h is this package's handler on its fast
// path it skips the record, whose attributes past the fifth cost an allocation.
func LogAttrs(ctx context.Context, h slog.Handler, t time.Time, level slog.Level, msg string, attrs ...slog.Attr) error {
	if jh, ok := h.(*handler); ok && jh.fast {
		bp, b := jh.begin(t, level, msg)
		for _, a := range attrs {
			if b, ok = appendAttr(b, a); !ok {
				break
			}
		}
		if ok {
			return jh.flushUrgent(level, jh.finish(bp, b))
		}
		release(bp, b)
	}
	r := slog.NewRecord(t, level, msg, 0)
	r.AddAttrs(attrs...)
	return h.Handle(ctx, r)
}

// begin takes a pooled buffer and encodes a line's opening: time, level, message and
// the WithAttrs attributes. finish or release gives the buffer back.
func (h *handler) begin(t time.Time, level slog.Level, msg string) (*[]byte, []byte) {
	bp := bufPool.Get().(*[]byte)
	b := append((*bp)[:0], '{')
	if !t.IsZero() {
		b = append(b, `"time":`...)
		b = appendTime(b, t.Round(0))
		b = append(b, ',')
	}
	b = append(b, `"level":`...)
	b = appendString(b, level.String())
	b = append(b, `,"msg":`...)
	b = appendString(b, msg)
	b = append(b, ',')
	return bp, append(b, h.pre...)
}

// finish closes the line begun in b and writes it.
func (h *handler) finish(bp *[]byte, b []byte) error {
	// Every attribute ends in ','; the last one becomes the closing brace.
	b[len(b)-1] = '}'
	b = append(b, '\n')
	defer release(bp, b)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.w.Write(b)
	return err
}

// release gives b's storage back to the pool, unless a huge line grew it.
func release(bp *[]byte, b []byte) {
	if cap(b) <= maxPooledBuf {
		*bp = b[:0]
		bufPool.Put(bp)
	}
}

// appendAttr appends `"key":value,` and reports whether a's kind is one the
// fast path encodes exactly like slog; if not, b's content is unspecified.
// None of these kinds can form slog's empty Attr, so none is elided.
func appendAttr(b []byte, a slog.Attr) ([]byte, bool) {
	v := a.Value
	switch v.Kind() {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindFloat64,
		slog.KindBool, slog.KindDuration, slog.KindTime:
	default:
		return b, false
	}
	b = appendString(b, a.Key)
	b = append(b, ':')
	switch v.Kind() {
	case slog.KindString:
		b = appendString(b, v.String())
	case slog.KindInt64:
		b = strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		b = strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindFloat64:
		b = appendFloat(b, v.Float64())
	case slog.KindBool:
		b = strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		b = strconv.AppendInt(b, int64(v.Duration()), 10)
	case slog.KindTime:
		b = appendTime(b, v.Time())
	}
	return append(b, ','), true
}

// appendFloat formats f as encoding/json does (ES6 number formatting); for
// NaN and infinities it writes the error string slog writes when json fails.
func appendFloat(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return appendString(b, "!ERROR:json: unsupported value: "+strconv.FormatFloat(f, 'g', -1, 64))
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// json writes e-7, not e-07.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// appendTime writes t as slog does: RFC 3339 with nanoseconds, preceded by
// an error string (and still followed by the time) when the year has other
// than four digits.
func appendTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y >= 10000 {
		b = appendString(b, "!ERROR:time.Time year outside of range [0,9999]")
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendString appends s quoted and escaped as slog's JSONHandler does:
// encoding/json's rules without HTML escaping, invalid UTF-8 bytes replaced
// by \ufffd, and U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if safe[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

const hex = "0123456789abcdef"

// safe marks the bytes that are copied as they are: ASCII but for the control
// characters, '"' and '\\'. Bytes from utf8.RuneSelf up start a rune that
// appendString checks.
var safe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()
