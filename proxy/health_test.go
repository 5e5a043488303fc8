package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// /livez and /readyz answer the same on the admin socket and on the metrics listener:
// /livez 200 whatever the readiness, /readyz 200 only when ready and 503 with the reason
// otherwise (forwarding on, draining).
func TestHealthEndpoints(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T) *harness // leaves the sidecar in the state under test
		ready bool
		why   string // in the 503 body
	}{
		{"ready", func(t *testing.T) *harness { return newHarness(t) }, true, ""},
		{"forwarding on", func(t *testing.T) *harness {
			proc := t.TempDir()
			writeProc(t, proc, "1", "0")
			return newHarness(t, func(c *Config) { c.RequireNoForwarding, c.ProcRoot = true, proc })
		}, false, "not ready: sys/net/ipv4/ip_forward is 1"},
		{"draining", func(t *testing.T) *harness {
			h := newHarness(t)
			h.apply(`"public"`)
			// A live tunnel holds the drain open, and with it the admin and metrics servers,
			// until the cleanup closes it: a drain deadline would race the checks below.
			_, c := h.connect(h.a.echoHostPort("a.test"), "")
			if c == nil {
				t.Fatal("CONNECT refused")
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- h.srv.Shutdown(ctx) }()
			t.Cleanup(func() {
				c.Close()
				if err := <-done; err != nil {
					t.Errorf("shutdown: %v", err)
				}
				cancel()
			})
			// The drain has begun once the proxy listener is closed.
			waitFor(t, func() bool {
				d, err := net.DialTimeout("tcp", h.srv.ProxyAddr().String(), time.Second)
				if err == nil {
					d.Close()
				}
				return err != nil
			})
			return h
		}, false, "not ready: draining"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.setup(t)
			unixClient := &http.Client{Timeout: hangGuard, Transport: &http.Transport{
				DisableKeepAlives: true,
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", h.socket)
				},
			}}
			tcpClient := &http.Client{Timeout: hangGuard, Transport: &http.Transport{DisableKeepAlives: true}}
			for _, ep := range []struct {
				name, base string
				client     *http.Client
			}{
				{"admin socket", "http://admin", unixClient},
				{"metrics listener", "http://" + h.srv.MetricsAddr().String(), tcpClient},
			} {
				if code, body := healthGet(t, ep.client, ep.base+"/livez"); code != 200 || body != "ok\n" {
					t.Errorf("%s /livez: %d %q, want 200 \"ok\\n\"", ep.name, code, body)
				}
				code, body := healthGet(t, ep.client, ep.base+"/readyz")
				switch {
				case tc.ready && (code != 200 || body != "ready\n"):
					t.Errorf("%s /readyz: %d %q, want 200 \"ready\\n\"", ep.name, code, body)
				case !tc.ready && (code != http.StatusServiceUnavailable || !strings.Contains(body, tc.why)):
					t.Errorf("%s /readyz: %d %q, want 503 with %q", ep.name, code, body, tc.why)
				}
			}
		})
	}
}

func healthGet(t *testing.T, client *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
