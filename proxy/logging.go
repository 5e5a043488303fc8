package proxy

import (
	"context"
	"log/slog"
	"net/netip"
)

// logDecision writes the one JSON line of a decision: allowed at INFO, denied at WARN,
// so --log-level=warn keeps exactly the blocked attempts.
func (s *Server) logDecision(rs *RuleSet, typ, decision, reason, rule, host string, port uint16, addr netip.Addr, client string, extra ...any) {
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
	attrs := append([]any{
		"decision", decision, "reason", reason, "rule", rule, "host", host, "port", port,
		"addr", dialled, "client", client, "type", typ, "mode", string(rs.Mode()),
		"generation", rs.Generation, "task", rs.Task, "phase", rs.Phase,
	}, extra...)
	s.log.Log(context.Background(), level, "decision", attrs...)
}
