package proxy

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/compass-egress/compass-egress/internal/jsonlog"
)

// logDecision writes the one JSON line of a decision: allowed at INFO, denied at WARN,
// so --log-level=warn keeps exactly the blocked attempts. It runs once per connection
// and request, so it builds typed attributes (LogAttrs) rather than boxing each value.
// maxHostBytes bounds a host as decision lines and the blocked table keep it: a valid
// name has at most 253 bytes, and a refused one may fill a 64 KiB request line.
const maxHostBytes = 255

func clipHost(host string) string {
	if len(host) > maxHostBytes {
		return host[:maxHostBytes]
	}
	return host
}

// maxErrorBytes bounds an error as a log line quotes it: net/http's parser quotes a
// malformed status line or header whole, so an upstream chooses that text, up to an
// answer head's bound (four times that once each byte is quoted).
const maxErrorBytes = 512

func clipError(err error) string { return clipText(err.Error()) }

func (s *Server) logDecision(rs *RuleSet, typ, decision, reason, rule, host string, port uint16, addr netip.Addr, client string, extra ...slog.Attr) {
	level := slog.LevelInfo
	if decision != "allowed" {
		level = slog.LevelWarn
	}
	if !s.log.Enabled(context.Background(), level) {
		return
	}
	dialled := ""
	if addr.IsValid() {
		dialled = addr.String()
	}
	var buf [16]slog.Attr
	attrs := append(buf[:0],
		slog.String("decision", decision), slog.String("reason", reason), slog.String("rule", rule),
		slog.String("host", clipHost(host)), slog.Int("port", int(port)), slog.String("addr", dialled),
		slog.String("client", client), slog.String("type", typ), slog.String("mode", string(rs.Mode())),
		slog.Uint64("generation", rs.Generation), slog.String("task", rs.Task), slog.String("phase", rs.Phase))
	attrs = append(attrs, extra...)
	s.logLine(level, "decision", attrs...)
}

// logLine writes one record straight to the handler (through jsonlog.LogAttrs, which
// skips building a record when it can). Logger.LogAttrs would also walk the stack for
// the caller's address, which the JSON lines never show; these lines are written once
// per connection or request.
func (s *Server) logLine(level slog.Level, msg string, attrs ...slog.Attr) {
	h := s.log.Handler()
	if !h.Enabled(context.Background(), level) {
		return
	}
	_ = jsonlog.LogAttrs(context.Background(), h, time.Now(), level, msg, attrs...)
}
