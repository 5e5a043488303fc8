package proxy

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"unicode/utf8"
)

// The components of compass_proxy_panics_total: where a panic was recovered.
const (
	componentFront    = "front"    // a client connection's worker, a request's watch
	componentTunnel   = "tunnel"   // a tunnel's relay or idle watch
	componentDNS      = "dns"      // a query to the sandbox's resolver
	componentResolver = "resolver" // the proxy's own lookup of a name it decides on
)

var panicComponents = []string{componentFront, componentTunnel, componentDNS, componentResolver}

// maxStackBytes bounds the stack a panic's log line carries: the frames that matter
// are the first ones, and a deep recursion would otherwise write megabytes in one line.
const maxStackBytes = 8 << 10

// recovered logs and counts a panic that one connection or query (of type typ, from
// client) raised and the proxy recovered from, as net/http's server and CoreDNS do: a
// bug one client can reach must not take every other connection, and the sandbox's
// egress for the rest of its phase, down with the process. It is called from the
// deferred function that recovered p, so the stack still holds the panic's frames.
// http.ErrAbortHandler is a handler's deliberate abort, neither logged nor counted.
func (s *Server) recovered(component, typ, client string, p any) {
	if p == http.ErrAbortHandler {
		return
	}
	s.metrics.panics.WithLabelValues(component).Inc()
	stack := debug.Stack()
	if len(stack) > maxStackBytes {
		stack = append(stack[:maxStackBytes:maxStackBytes], "..."...)
	}
	s.log.Error("panic recovered", "component", component, "type", typ, "client", client,
		"panic", clipText(fmt.Sprint(p)), "stack", string(stack))
}

// clipText cuts text to maxErrorBytes, not in the middle of a character.
func clipText(text string) string {
	if len(text) <= maxErrorBytes {
		return text
	}
	cut := maxErrorBytes
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + "..."
}
