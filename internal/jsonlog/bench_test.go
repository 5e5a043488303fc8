package jsonlog

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// decisionAttrs has the shape of the proxy's decision line (proxy.logDecision).
var decisionAttrs = []slog.Attr{
	slog.String("decision", "allowed"), slog.String("reason", "rule"), slog.String("rule", "*.example.test"),
	slog.String("host", "api.example.test"), slog.Int("port", 443), slog.String("addr", "192.0.2.17"),
	slog.String("client", "10.0.0.2:51234"), slog.String("type", "connect"), slog.String("mode", "enforce"),
	slog.Uint64("generation", 42), slog.String("task", "build-1234"), slog.String("phase", "run"),
}

// benchPair runs the slog sub-benchmark, then the jsonlog one, which reports
// its speed as a multiple of the slog ns/op measured just before in this run.
func benchPair(b *testing.B, op func(b *testing.B, h slog.Handler)) {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	var slogNs float64
	b.Run("slog", func(b *testing.B) {
		b.ReportAllocs()
		op(b, slog.NewJSONHandler(io.Discard, opts))
		slogNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("jsonlog", func(b *testing.B) {
		b.ReportAllocs()
		op(b, NewHandler(io.Discard, opts))
		if ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N); slogNs > 0 && ns > 0 {
			b.ReportMetric(slogNs/ns, "x-slog-speed")
		}
	})
}

// BenchmarkHandler measures the handler alone: Handle of a decision record.
func BenchmarkHandler(b *testing.B) {
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "decision", 0)
	r.AddAttrs(decisionAttrs...)
	benchPair(b, func(b *testing.B, h slog.Handler) {
		ctx := context.Background()
		for b.Loop() {
			if err := h.Handle(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLogAttrs measures what the proxy pays per decision: Logger.LogAttrs,
// including the Logger's own record building and caller lookup.
func BenchmarkLogAttrs(b *testing.B) {
	benchPair(b, func(b *testing.B, h slog.Handler) {
		l := slog.New(h)
		ctx := context.Background()
		for b.Loop() {
			l.LogAttrs(ctx, slog.LevelInfo, "decision", decisionAttrs...)
		}
	})
}
