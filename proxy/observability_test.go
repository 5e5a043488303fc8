package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// A client that sends half a head, or nothing, is cut at --header-timeout: the half
// head gets a 400, the silent client a close. The proxy's close is what shows the cut
// (the client's own read deadline is only a hang guard): nothing else closes a
// connection that has not sent a whole head, as the keep-alive idle timeout (90 s by
// default) bounds only the wait between requests.
func TestHeaderTimeoutCutsSlowHeads(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = 200 * time.Millisecond })
	h.apply(`"public"`)
	for _, tc := range []struct{ send, want string }{
		{"GET http://a.test/ HTTP/1.1\r\nHo", "HTTP/1.1 400"},
		{"", ""},
	} {
		c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, tc.send)
		_ = c.SetReadDeadline(time.Now().Add(hangGuard))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Errorf("%q: read %v after %q, want the proxy's close (cut by the header timeout)", tc.send, err, got)
		}
		if !strings.HasPrefix(string(got), tc.want) {
			t.Errorf("%q: got %q, want %q", tc.send, got, tc.want)
		}
	}
}

// Every decision line carries the fields the issue names, with the decision's values,
// for CONNECT and DNS alike.
func TestDecisionLineFields(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Task, c.Phase = "t1", "p1" })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	h.connectStatus("b.test:443")
	h.connectStatus(h.a.echoHostPort("a.test"))
	h.query("b.test", dns.TypeA, "udp")
	var lines []map[string]any
	decisions := func() bool {
		lines = nil
		for _, l := range strings.Split(h.logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "decision" {
				lines = append(lines, m)
			}
		}
		return len(lines) >= 3
	}
	// The DNS server logs its decision after it has answered.
	waitFor(t, decisions)
	if len(lines) != 3 {
		t.Fatalf("%d decision lines, want 3:\n%s", len(lines), h.logs.String())
	}
	for _, m := range lines {
		for _, k := range []string{"time", "decision", "reason", "rule", "host", "port", "addr", "client", "type", "mode", "generation", "task", "phase"} {
			if _, ok := m[k]; !ok {
				t.Errorf("decision line lacks %s: %v", k, m)
			}
		}
	}
	want := []map[string]any{
		{"level": "WARN", "decision": "denied", "reason": "not-allowlisted", "host": "b.test", "port": 443.0, "type": "connect", "mode": "allowlist", "task": "t1", "phase": "p1", "generation": 2.0, "addr": ""},
		{"level": "INFO", "decision": "allowed", "host": "a.test", "port": float64(h.a.echoPort), "addr": "127.0.0.2", "type": "connect", "rule": "a.test", "generation": 2.0},
		{"level": "WARN", "decision": "denied", "host": "b.test", "type": "dns", "qtype": "A", "mode": "allowlist", "generation": 2.0},
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, lines[i][k], v)
			}
		}
	}
}

// A rejected policy, the connection bound and a dial show in the metrics.
func TestMetricsRecordWhatHappened(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConnections = 7 })
	h.apply(`"public"`)
	h.admin("PUT", "/v1/policy", `nope`)
	h.connectStatus(h.a.echoHostPort("a.test"))
	m := h.metricsText()
	for _, want := range []string{
		`compass_proxy_policy_reloads_total{result="failure"} 1`,
		`compass_proxy_config_last_reload_successful 0`,
		`compass_proxy_max_connections 7`,
		`compass_proxy_dial_duration_seconds_count 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// Unicode and punycode spellings of a name match the same rule through the proxy.
func TestIDNThroughTheProxy(t *testing.T) {
	h := newHarness(t)
	h.dns.set("xn--bcher-kva.test", netip.MustParseAddr("127.0.0.2"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["bücher.test"]}`)
	for _, host := range []string{"xn--bcher-kva.test", "XN--BCHER-KVA.test.", "bücher.test", "BÜCHER.test"} {
		if s, hd := h.connectStatus(fmt.Sprintf("%s:%d", host, h.a.echoPort)); s != 200 {
			t.Errorf("%s: %d %s", host, s, hd)
		}
	}
}

// A refused host as long as a request line allows is clipped in its decision line (as
// in the blocked table): one request must not write a 64 KiB log line.
func TestDecisionLineClipsTheHost(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	long := strings.Repeat("x", 60<<10) + ".test"
	h.raw("GET http://" + long + "/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	var line string
	waitFor(t, func() bool {
		for _, l := range strings.Split(h.logs.String(), "\n") {
			if strings.Contains(l, `"msg":"decision"`) {
				line = l
				return true
			}
		}
		return false
	})
	if len(line) > 2048 || !strings.Contains(line, `"host":"`+strings.Repeat("x", maxHostBytes)+`"`) {
		t.Fatalf("decision line of %d bytes, want the host clipped to %d: %.300s", len(line), maxHostBytes, line)
	}
}

// A head the proxy refuses before any destination is decided (malformed, too long, a
// desync attempt) is still a refusal: counted under its reason and logged with the
// client, though not listed in /v1/blocked, which lists destinations.
func TestMalformedHeadsAreCountedAndLogged(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	cases := []struct {
		name, raw, status, typ, reason, host string
	}{
		{"unparsable", "GET http://a.test/ HTTP/1.1\r\nHost a.test\r\n\r\n", "HTTP/1.1 400", typeHTTP, ReasonMalformedRequest, ""},
		{"too long", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: " + strings.Repeat("x", httpfront.MaxHeadBytes) + "\r\n\r\n", "HTTP/1.1 431", typeHTTP, ReasonHeadTooLong, ""},
		{"length and chunked", "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "HTTP/1.1 400", typeHTTP, ReasonMalformedRequest, "a.test"},
		{"CONNECT with length and chunked", "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 400", typeConnect, ReasonMalformedRequest, "a.test:443"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(h.srv.metrics.requests.WithLabelValues(tc.typ, "denied", tc.reason))
			logged := len(h.logs.String())
			if out := h.raw(tc.raw); !strings.HasPrefix(out, tc.status) {
				t.Fatalf("answer %q, want %s", firstLine(out), tc.status)
			}
			if got := testutil.ToFloat64(h.srv.metrics.requests.WithLabelValues(tc.typ, "denied", tc.reason)); got != before+1 {
				t.Errorf("requests_total{type=%q,decision=\"denied\",reason=%q} went from %v to %v, want one more", tc.typ, tc.reason, before, got)
			}
			line := fmt.Sprintf(`"msg":"decision","decision":"denied","reason":%q,"rule":"","host":%q,"port":0,"addr":"","client":"127.0.0.1:`, tc.reason, tc.host)
			if logs := h.logs.String()[logged:]; !strings.Contains(logs, line) {
				t.Errorf("no decision line %s in:\n%s", line, logs)
			}
		})
	}
	if _, blocked := h.admin("GET", "/v1/blocked", ""); blocked["total"] != float64(0) {
		t.Errorf("GET /v1/blocked lists refusals without a destination: %v", blocked)
	}
}

// TestMetricsGaugesAndLabels: the active-connection gauge counts what is live (a test
// that only ever waits for 0 passes with a gauge never raised), an unlisted query type
// is counted as "other", and every label of every metric is one of a fixed set: none
// can carry a host, an address or any other value a client chooses.
func TestMetricsGaugesAndLabels(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	_, tc := h.connect(h.a.echoHostPort("a.test"), "")
	if tc == nil {
		t.Fatal("CONNECT refused")
	}
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 1 })
	tc.Close()
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.activeConnect) == 0 })

	h.query("a.test", 65280, "udp")
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("allowed", "other")) == 1
	})

	families, err := h.srv.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"type": true, "decision": true, "reason": true, "qtype": true,
		"direction": true, "result": true, "protocol": true, "version": true, "goversion": true, "component": true}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !allowed[l.GetName()] {
					t.Errorf("%s has a label %q outside the fixed set", f.GetName(), l.GetName())
				}
			}
		}
	}
}

// TestEveryMetricDocumented: each compass_ metric the proxy registers has a row in the
// README's table and a section in docs/proxy.md, each with the code's type and label
// names, so neither can fall behind the code.
func TestEveryMetricDocumented(t *testing.T) {
	m := newMetrics()
	m.requests.WithLabelValues(typeHTTP, "allowed", "public")
	m.dnsQueries.WithLabelValues("allowed", "A")
	m.dialDuration.Observe(0)
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/proxy.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "compass_") {
			continue
		}
		n++
		typ := strings.ToLower(f.GetType().String())
		var labels []string
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, lp := range ms[0].GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		slices.Sort(labels)
		// README: | `name` | type | `label` (values), ... | what |
		row := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(name) + "` \\| ([a-z]+) \\|([^|]*)\\|").FindStringSubmatch(string(readme))
		if row == nil {
			t.Errorf("README.md has no row for %s", name)
		} else {
			var got []string
			// Label names are the backquoted words outside the parentheses of values.
			cell := regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(row[2], "")
			for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(cell, -1) {
				got = append(got, m[1])
			}
			slices.Sort(got)
			if row[1] != typ || !slices.Equal(got, labels) {
				t.Errorf("README.md: %s is a %s with labels %v; the code's is a %s with labels %v", name, row[1], got, typ, labels)
			}
		}
		// docs/proxy.md: ### `name{label,...}` (type)
		sec := regexp.MustCompile("(?m)^### `" + regexp.QuoteMeta(name) + "(?:\\{([a-z_,]*)\\})?` \\(([a-z]+)\\)$").FindStringSubmatch(string(doc))
		if sec == nil {
			t.Errorf("docs/proxy.md has no section for %s", name)
		} else {
			var got []string
			if sec[1] != "" {
				got = strings.Split(sec[1], ",")
			}
			slices.Sort(got)
			if sec[2] != typ || !slices.Equal(got, labels) {
				t.Errorf("docs/proxy.md: %s is a %s with labels %v; the code's is a %s with labels %v", name, sec[2], got, typ, labels)
			}
		}
	}
	if n < 12 {
		t.Errorf("only %d compass_ metrics gathered", n)
	}
}

// A fresh registry already has the series a dashboard rates or alerts on, at 0 (a series
// that appears only with its first event hides that event from rate()), build_info at 1,
// the active and bytes series each under its own label, and DNS types by name.
func TestMetricsInitialSeries(t *testing.T) {
	m := newMetrics()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			var labels []string
			for _, lp := range s.GetLabel() {
				if lp.GetName() != "version" && lp.GetName() != "goversion" {
					labels = append(labels, lp.GetName()+"="+lp.GetValue())
				}
			}
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue()
			got[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	for series, want := range map[string]float64{
		"compass_proxy_build_info{}":                         1,
		"compass_proxy_policy_reloads_total{result=success}": 0,
		"compass_proxy_policy_reloads_total{result=failure}": 0,
		"compass_proxy_dns_overloaded_total{protocol=udp}":   0,
		"compass_proxy_dns_overloaded_total{protocol=tcp}":   0,
		"compass_proxy_active_connections{type=http}":        0,
		"compass_proxy_active_connections{type=connect}":     0,
		"compass_proxy_bytes_total{direction=upstream}":      0,
		"compass_proxy_bytes_total{direction=downstream}":    0,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	m.activeHTTP.Inc()
	m.bytesUp.Add(3)
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"active http", testutil.ToFloat64(m.active.WithLabelValues(typeHTTP)), 1},
		{"active connect", testutil.ToFloat64(m.active.WithLabelValues(typeConnect)), 0},
		{"bytes upstream", testutil.ToFloat64(m.bytes.WithLabelValues("upstream")), 3},
		{"bytes downstream", testutil.ToFloat64(m.bytes.WithLabelValues("downstream")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}
