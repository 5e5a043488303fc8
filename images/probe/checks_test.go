package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRunCheck: each kind's verdict (reachable, resolved) and detail against loopback
// fakes that allow, deny, refuse or drop.
func TestRunCheck(t *testing.T) {
	allow := startProxy(t, http.StatusOK)
	deny := startProxy(t, http.StatusForbidden)
	dropping := silent(t)
	dnsUDP, dnsTCP := startDNS(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(web.Close)
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusForbidden) }))
	t.Cleanup(forbidden.Close)
	admin := http.NewServeMux()
	admin.HandleFunc("GET /v1/policy", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, `{"generation":7,"mode":"allowlist"}`) })
	adminAPI := httptest.NewServer(admin)
	t.Cleanup(adminAPI.Close)
	notAdmin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, `{"mode":"allowlist"}`) }))
	t.Cleanup(notAdmin.Close)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	const short = 300 // ms: the drop cases time out after this

	tests := []struct {
		name      string
		check     Check
		reachable bool
		resolved  bool
		detail    string // the detail contains this
		saw       []string
	}{
		{"proxy GET allowed", Check{Kind: "proxy", Target: "a.test:80", Proxy: allow.Addr}, true, false,
			"GET via proxy: 200 OK fakenet a.test", []string{"GET http://a.test:80/ Host=a.test"}},
		{"proxy CONNECT allowed", Check{Kind: "proxy", Target: "a.test:443", Proxy: allow.Addr}, true, false,
			"GET through CONNECT tunnel: 200 OK fakenet a.test", []string{"CONNECT a.test:443 Host=a.test:443 | GET / Host=a.test"}},
		{"proxy GET denied", Check{Kind: "proxy", Target: "b.test:80", Proxy: deny.Addr}, false, false,
			"GET via proxy: 403 Forbidden", []string{"GET http://b.test:80/ Host=b.test"}},
		{"proxy CONNECT denied", Check{Kind: "proxy", Target: "b.test:443", Proxy: deny.Addr}, false, false,
			"CONNECT: proxy answered 403 Forbidden", []string{"CONNECT b.test:443 Host=b.test:443"}},
		{"proxy refuses connections", Check{Kind: "proxy", Target: "a.test:443", Proxy: closedTCP(t)}, false, false,
			"proxy: dial tcp", nil},
		{"proxy drops CONNECT", Check{Kind: "proxy", Target: "a.test:443", Proxy: dropping, TimeoutMS: short}, false, false,
			"CONNECT: ", nil},
		{"proxy drops GET", Check{Kind: "proxy", Target: "a.test:80", Proxy: dropping, TimeoutMS: short}, false, false,
			"GET via proxy: ", nil},
		{"proxy target without port", Check{Kind: "proxy", Target: "a.test", Proxy: allow.Addr}, false, false,
			"missing port in address", nil},
		{"http 200", Check{Kind: "http", Target: host(web)}, true, false, "direct GET: 200 OK", nil},
		{"http 403 is an answer", Check{Kind: "http", Target: host(forbidden)}, true, false, "direct GET: 403 Forbidden", nil},
		{"http refused", Check{Kind: "http", Target: closedTCP(t)}, false, false, "connection refused", nil},
		{"http dropped", Check{Kind: "http", Target: dropping, TimeoutMS: short}, false, false, "direct GET: ", nil},
		{"tcp connects", Check{Kind: "tcp", Target: host(web)}, true, false, "connected", nil},
		{"tcp refused is reachable", Check{Kind: "tcp", Target: closedTCP(t)}, true, false, "refused (the host answered)", nil},
		{"tcp bad target", Check{Kind: "tcp", Target: "127.0.0.1"}, false, false, "missing port in address", nil},
		{"dns resolves over UDP", Check{Kind: "dns", Server: dnsUDP, QName: "a.test"}, true, true, "udp DNS: NOERROR 192.0.2.1", nil},
		{"dns resolves over TCP", Check{Kind: "dns", Net: "tcp", Server: dnsTCP, QName: "a.test."}, true, true, "tcp DNS: NOERROR 192.0.2.1", nil},
		{"dns NXDOMAIN is reachable, not resolved", Check{Kind: "dns", Server: dnsUDP, QName: "b.test"}, true, false, "udp DNS: NXDOMAIN", nil},
		{"dns UDP refused is reachable", Check{Kind: "dns", Server: closedUDP(t), QName: "a.test"}, true, false, "udp DNS: refused (the host answered)", nil},
		{"dns TCP refused is reachable", Check{Kind: "dns", Net: "tcp", Server: closedTCP(t), QName: "a.test"}, true, false, "tcp DNS: refused (the host answered)", nil},
		{"dns UDP dropped", Check{Kind: "dns", Server: silentUDP(t), QName: "a.test", TimeoutMS: short}, false, false, "udp DNS: ", nil},
		{"admin API", Check{Kind: "admin", Target: host(adminAPI)}, true, false, "admin API answered: 200 OK", nil},
		{"admin: 200 without a policy", Check{Kind: "admin", Target: host(notAdmin)}, false, false, "no admin API there (200 OK)", nil},
		{"admin: another server", Check{Kind: "admin", Target: host(forbidden)}, false, false, "no admin API there (403 Forbidden)", nil},
		{"admin refused", Check{Kind: "admin", Target: closedTCP(t)}, false, false, "connection refused", nil},
		{"unknown kind", Check{Kind: "ftp", Target: host(web)}, false, false, "unknown check kind ftp", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check.Name = tc.name
			got := runChecks([]Check{tc.check})
			if len(got) != 1 {
				t.Fatalf("%d results for one check: %+v", len(got), got)
			}
			r := got[0]
			if r.Name != tc.name || r.Reachable != tc.reachable || r.Resolved != tc.resolved || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("got %+v\nwant name %q reachable %v resolved %v, detail containing %q", r, tc.name, tc.reachable, tc.resolved, tc.detail)
			}
		})
	}
	// What the proxies were asked, in any order: the form of the requests is the
	// contract with compass-proxy.
	var want []string
	for _, tc := range tests {
		want = append(want, tc.saw...)
	}
	got := append(allow.requests(), deny.requests()...)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("proxies saw\n%q\nwant\n%q", got, want)
	}
}

// TestRunChecksTimeouts: checks run at once, each under its own timeout (3 s unless
// timeout_ms), and the results keep the order and names of the checks. Only lower
// bounds are timed (no check ends before its timeout), as a loaded machine may end
// any of them late: a timeout_ms above the default shows that it, not the default,
// applies; the dropping proxy sees the checks wait at the same time; a hang guard
// catches a check that never ends.
func TestRunChecksTimeouts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		checks   func(t *testing.T, dropping string) []Check
		min      time.Duration
		together int // checks the dropping proxy holds at once
	}{
		{"timeout_ms", func(_ *testing.T, dropping string) []Check {
			return []Check{{Name: "x", Kind: "proxy", Target: "a.test:443", Proxy: dropping, TimeoutMS: 4000}}
		}, 3900 * time.Millisecond, 1},
		{"default, at once", func(_ *testing.T, dropping string) []Check {
			return []Check{
				{Name: "a", Kind: "proxy", Target: "a.test:443", Proxy: dropping},
				{Name: "b", Kind: "tcp", Target: "127.0.0.1"},
				{Name: "c", Kind: "proxy", Target: "a.test:80", Proxy: dropping},
			}
		}, 2900 * time.Millisecond, 2},
		// The DNS library's own 2 s read timeout once cut this one short.
		{"DNS default", func(t *testing.T, _ string) []Check {
			return []Check{{Name: "d", Kind: "dns", Server: silentUDP(t), QName: "a.test"}}
		}, 2900 * time.Millisecond, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dropping, together := silentCounting(t)
			checks := tc.checks(t, dropping)
			start := time.Now()
			done := make(chan []Result, 1)
			go func() { done <- runChecks(checks) }()
			var got []Result
			select {
			case got = <-done:
			case <-time.After(hangGuard):
				t.Fatalf("the checks have not ended %v after they began", hangGuard)
			}
			if took := time.Since(start); took < tc.min {
				t.Errorf("the checks took %v, want at least %v (cut before their timeout)", took, tc.min)
			}
			if n := together(); n != tc.together {
				t.Errorf("the dropping proxy held at most %d checks at once, want %d (the checks run at once)", n, tc.together)
			}
			var names []string
			for _, r := range got {
				names = append(names, r.Name)
				if r.Reachable {
					t.Errorf("%s: reachable through a proxy that drops: %+v", r.Name, r)
				}
			}
			var want []string
			for _, c := range checks {
				want = append(want, c.Name)
			}
			if !slices.Equal(names, want) {
				t.Errorf("result names %q, want %q (the order of the checks)", names, want)
			}
		})
	}
}

// FuzzOriginAnswer: whatever a proxy or origin sends back, the probe does not panic,
// and it calls a target reachable only for a well-formed 200 answer.
func FuzzOriginAnswer(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 403 Forbidden\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody without length",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200\r\n\r\n",
		"SSH-2.0-OpenSSH\r\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := originAnswer(bufio.NewReader(bytes.NewReader(in)), "what")
		if !strings.HasPrefix(r.Detail, "what: ") {
			t.Errorf("detail %q does not start with what was tried", r.Detail)
		}
		if !r.Reachable {
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(in)), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("reachable on %q, which is not a 200 answer (%v)", in, err)
		}
	})
}

// TestRunCheckHonoursContext: every kind gives up when its context (the check's
// timeout) is done.
func TestRunCheckHonoursContext(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(web.Close)
	addr := strings.TrimPrefix(web.URL, "http://")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []Check{
		{Kind: "proxy", Target: "a.test:443", Proxy: addr},
		{Kind: "http", Target: addr},
		{Kind: "admin", Target: addr},
		{Kind: "tcp", Target: addr},
		{Kind: "dns", Net: "tcp", Server: addr, QName: "a.test"},
	} {
		if r := runCheck(ctx, c); r.Reachable || !strings.Contains(r.Detail, "canceled") {
			t.Errorf("%s under a cancelled context: %+v, want not reachable, detail naming the cancellation", c.Kind, r)
		}
	}
}
