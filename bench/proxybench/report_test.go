package proxybench

import (
	"math"
	"strings"
	"testing"
)

func sampleReport() *Report {
	v := func(bulk, setups, reqs, p50, p99, rss float64) Values {
		vals := NoValues()
		copy(vals[:], []float64{bulk, setups, reqs, p50, p99, rss})
		if !math.IsNaN(rss) {
			vals[MetricSetupCPU] = 1000 / setups // cheaper per set-up when faster
		}
		return vals
	}
	return &Report{
		Targets: []string{NameDirect, NameCompass, NameCompassAllowlist, NameSquid, NameTinyproxy},
		Values: map[string]Values{
			NameDirect:           v(4000, 10000, 100000, 10, 20, math.NaN()),
			NameCompass:          v(2400, 8000, 40000, 40, 80, 10),
			NameCompassAllowlist: v(2300, 7000, 39000, 41, 90, 10.5),
			NameSquid:            v(1500, 4000, 20000, 100, 200, 30),
			NameTinyproxy:        v(800, 6000, 5000, 150, 300, 18),
		},
		Errors:           map[string]int64{NameSquid: 3},
		Direct:           NameDirect,
		Compass:          NameCompass,
		CompassAllowlist: NameCompassAllowlist,
		Peers:            []string{NameSquid, NameTinyproxy},
	}
}

func TestBetterPeer(t *testing.T) {
	r := sampleReport()
	tests := []struct {
		m    Metric
		want string
	}{
		{MetricBulk, NameSquid},
		{MetricSetups, NameTinyproxy},
		{MetricP50, NameSquid},         // lower is better
		{MetricIdleRSS, NameTinyproxy}, // lower is better
	}
	for _, tt := range tests {
		if got := r.betterPeer(tt.m); got != tt.want {
			t.Errorf("betterPeer(%s) = %q, want %q", metricInfos[tt.m].title, got, tt.want)
		}
	}
	r.Values[NameSquid] = NoValues()
	if got := r.betterPeer(MetricBulk); got != NameTinyproxy {
		t.Errorf("betterPeer with squid unmeasured = %q, want tinyproxy", got)
	}
}

func TestChecks(t *testing.T) {
	got := map[string]string{}
	for _, c := range sampleReport().Checks() {
		got[c.Want] = c.Got + " " + c.verdict()
	}
	want := map[string]string{
		"bulk throughput ≥ 0.5× direct":                                  "0.60× yes",
		"bulk throughput ≥ 1.3× the better peer":                         "1.60× yes",
		"tunnel set-ups/s ahead of the better peer (> 1×)":               "1.33× yes",
		"tunnel set-ups/s ≥ 1.5× squid":                                  "2.00× yes",
		"HTTP req/s ahead of the better peer (> 1×)":                     "2.00× yes",
		"HTTP req/s ≥ 1.5× squid":                                        "2.00× yes",
		"≤ 12 KiB per idle tunnel":                                       "10.0 KiB yes",
		"100k allowlist CONNECT bulk MB/s within 5% of public (≥ 0.95×)": "0.96× yes",
		"100k allowlist tunnel set-ups/s within 5% of public (≥ 0.95×)":  "0.88× **no**",
		"100k allowlist HTTP req/s within 5% of public (≥ 0.95×)":        "0.97× yes",
		"100k allowlist CPU ms/GB bulk within 5% of public (≤ 1.05×)":    "– n/a",
		"100k allowlist CPU µs/set-up within 5% of public (≤ 1.05×)":     "1.14× **no**",
		"100k allowlist CPU µs/request within 5% of public (≤ 1.05×)":    "– n/a",
	}
	if len(got) != len(want) {
		t.Errorf("%d checks, want %d: %v", len(got), len(want), got)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("check %q = %q, want %q", k, got[k], w)
		}
	}

	r := sampleReport()
	r.Peers = nil
	onlyBulk := NoValues()
	onlyBulk[MetricBulk] = 1000
	r.Values[NameCompass] = onlyBulk
	for _, c := range r.Checks() {
		switch c.Want {
		case "bulk throughput ≥ 0.5× direct":
			if c.Skip || c.Met {
				t.Errorf("%s: %+v, want measured and missed", c.Want, c)
			}
		case "bulk throughput ≥ 1.3× the better peer", "≤ 12 KiB per idle tunnel":
			if !c.Skip {
				t.Errorf("%s: %+v, want n/a without the values", c.Want, c)
			}
		}
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b strings.Builder
	sampleReport().WriteMarkdown(&b)
	out := b.String()
	for _, want := range []string{
		"| direct | 4000 | 10000 | 100000 | 10 | 20 | 0 |",
		"| squid | 1500 | 4000 | 20000 | 100 | 200 | 3 |",
		"| direct | – | – | – | – |",
		"| squid | 30.0 | – | 0 | – |",
		"| compass (public) | 0.60× | 0.80× | 0.40× | 4.00× | 4.00× |",
		"| compass (public) ÷ better peer | 1.60× (squid) | 1.33× (tinyproxy) | 2.00× (squid) | 0.40× (squid) | 0.40× (squid) |",
		"| compass (public) ÷ better peer | 0.56× (tinyproxy) | – | 0.75× (tinyproxy) | – |",
		"| compass (public) ÷ tinyproxy | 3.00× |",
		"| compass (100k allowlist) ÷ compass (public) | 0.96× | 0.88× | 0.97× | 1.02× | 1.12× |",
		"| compass (100k allowlist) ÷ compass (public) | 1.05× | – | 1.14× | – |",
		"| 100k allowlist tunnel set-ups/s within 5% of public (≥ 0.95×) | 0.88× | **no** |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| direct | 1.00×") {
		t.Error("direct is compared against itself")
	}
}
