package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestPanicInRelayReleasesRequest: a panic after goproxy handled an allowed request
// (recovered by the front) still removes the tracker entry and lowers the gauge.
func TestPanicInRelayReleasesRequest(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.wrapRelay = func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				next.ServeHTTP(w, r)
				if strings.HasSuffix(r.URL.Path, "/panic") {
					panic(http.ErrAbortHandler)
				}
			})
		}
	})
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if resp, err := h.client.Get(fmt.Sprintf("http://a.test:%d/panic", h.a.httpPort)); err == nil {
		resp.Body.Close()
	}
	waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
	if m := h.metricsText(); !strings.Contains(m, `compass_proxy_active_connections{type="http"} 0`) {
		t.Fatalf("gauge after the panic:\n%s", grepLines(m, "active_connections"))
	}
}
