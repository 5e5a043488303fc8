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

// A check against the better peer needs both peers' values: with one missing it is n/a,
// not a comparison with whichever peer is left.
func TestChecksBetterPeerNeedsBothPeers(t *testing.T) {
	measured := map[string]string{
		"bulk throughput ≥ 1.3× the better peer":           "1.60× yes",
		"tunnel set-ups/s ahead of the better peer (> 1×)": "1.33× yes",
		"HTTP req/s ahead of the better peer (> 1×)":       "2.00× yes",
	}
	unmeasured := func(p string) func(*Report) {
		return func(r *Report) {
			v := NoValues()
			v[MetricIdleRSS] = r.Values[p][MetricIdleRSS]
			r.Values[p] = v
		}
	}
	tests := []struct {
		name    string
		change  func(r *Report)
		skipped bool
	}{
		{"both measured", func(*Report) {}, false},
		{"tinyproxy measured no rates", unmeasured(NameTinyproxy), true},
		{"squid measured no rates", unmeasured(NameSquid), true},
		{"tinyproxy left out of the run", func(r *Report) {
			delete(r.Values, NameTinyproxy)
			r.Peers = []string{NameSquid}
		}, true},
		{"squid left out of the run", func(r *Report) {
			delete(r.Values, NameSquid)
			r.Peers = []string{NameTinyproxy}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleReport()
			tt.change(r)
			got := map[string]string{}
			for _, c := range r.Checks() {
				if _, ok := measured[c.Want]; ok {
					got[c.Want] = c.Got + " " + c.verdict()
				}
			}
			for check, want := range measured {
				if tt.skipped {
					want = "– n/a"
				}
				if got[check] != want {
					t.Errorf("%s: %q, want %q", check, got[check], want)
				}
			}
		})
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

// sampleRounds adds five rounds of set-ups to sampleReport, with the same medians. The
// rounds' order matters: paired by rank instead of by round, every spread below changes
// and the allowlist's threshold leaves its range.
func sampleRounds() *Report {
	r := sampleReport()
	setups := map[string][]float64{
		NameDirect:           {10000, 8000, 12000, 9000, 11000},
		NameCompass:          {8000, 6000, 9600, 7400, 8400},
		NameCompassAllowlist: {8400, 5000, 7000, 6500, 9000},
		NameSquid:            {4400, 3000, 4000, 3800, 4600},
		NameTinyproxy:        {6600, 5400, 6000, 5000, 7000},
	}
	r.PerRound = map[string]*RoundValues{}
	for t, v := range setups {
		if Median(v) != r.Values[t][MetricSetups] {
			panic("sampleRounds: median of " + t + " differs from sampleReport")
		}
		r.PerRound[t] = &RoundValues{MetricSetups: v}
	}
	return r
}

func TestSpread(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name        string
		left, right []float64
		want        Spread
	}{
		// Paired by round: 1.25, 0.80, 1.00 (rank order would give 1, 1, 1).
		{"paired by round", []float64{100, 80, 120}, []float64{80, 100, 120}, Spread{0.8, 1.25, 3}},
		// 1.2121, 1.1111, 1.6, 1.48, 1.2: nearest rank 2 and 4 of 5.
		{"interquartile by nearest rank", []float64{8000, 6000, 9600, 7400, 8400}, []float64{6600, 5400, 6000, 5000, 7000}, Spread{1.2, 1.48, 5}},
		// The NaN and zero rounds drop out without shifting the others: 2, 3.
		{"missing rounds skipped in place", []float64{2, nan, 5, 9}, []float64{1, 4, 0, 3}, Spread{2, 3, 2}},
		{"lengths differ: only common rounds", []float64{1, 4, 100}, []float64{1, 2}, Spread{1, 2, 2}},
		{"one round: no spread", []float64{3}, []float64{2}, Spread{}},
		{"no rounds", nil, nil, Spread{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Report{PerRound: map[string]*RoundValues{
				"l": {MetricSetups: tt.left},
				"r": {MetricSetups: tt.right},
			}}
			got := r.spread("l", "r", MetricSetups)
			if got.Rounds != tt.want.Rounds || math.Abs(got.Lo-tt.want.Lo) > 1e-9 || math.Abs(got.Hi-tt.want.Hi) > 1e-9 {
				t.Errorf("spread = %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := (&Report{}).spread("l", "r", MetricSetups); got.known() {
		t.Errorf("spread without rounds = %+v, want none", got)
	}
}

func TestChecksNoise(t *testing.T) {
	got := map[string][2]string{}
	for _, c := range sampleRounds().Checks() {
		got[c.Want] = [2]string{c.verdict(), c.noise()}
	}
	tests := []struct {
		want       string
		met, noise string
	}{
		// 1.33×, rounds 1.20–1.48: ahead of tinyproxy in every quartile.
		{"tunnel set-ups/s ahead of the better peer (> 1×)", "yes", "no"},
		// 2.00×, rounds 1.83–2.00.
		{"tunnel set-ups/s ≥ 1.5× squid", "yes", "no"},
		// 0.88×, rounds 0.83–1.05: missed by the medians, but 0.95 lies inside the rounds.
		{"100k allowlist tunnel set-ups/s within 5% of public (≥ 0.95×)", "**no**", "yes"},
		// Rounds of bulk, requests and memory are not in the sample.
		{"bulk throughput ≥ 0.5× direct", "yes", "–"},
		{"≤ 12 KiB per idle tunnel", "yes", "–"},
		{"100k allowlist CPU ms/GB bulk within 5% of public (≤ 1.05×)", "n/a", "–"},
	}
	for _, tt := range tests {
		if g := got[tt.want]; g != [2]string{tt.met, tt.noise} {
			t.Errorf("%s: met %q, within noise %q; want %q, %q", tt.want, g[0], g[1], tt.met, tt.noise)
		}
	}
}

// When the rounds mostly fall on the other side of the threshold from the ratio of the
// medians, the verdict is in doubt even though the threshold is outside their range.
func TestChecksNoiseRoundsDisagree(t *testing.T) {
	tests := []struct {
		name              string
		allowlist, public []float64 // per round, set-ups/s and CPU µs/set-up alike
		rate, cpu         string    // met and within noise
	}{
		// Medians 100 ÷ 100 = 1.00× (met: ≥ 0.95×, ≤ 1.05×); ratios 0.50, 0.50, 1.00,
		// 0.92, 0.51: range 0.50–0.92, below both thresholds.
		{"range below the medians' ratio", []float64{10, 11, 100, 101, 102}, []float64{20, 22, 100, 110, 200}, "yes yes", "yes no"},
		// Medians 101 ÷ 110 = 0.92× (missed; met for the cost); ratios 1.00, 1.00, 0.91,
		// 1.01, 1.00: range 1.00–1.00, above 0.95 and below 1.05.
		{"range above the medians' ratio", []float64{100, 101, 100, 111, 300}, []float64{100, 101, 110, 110, 300}, "**no** yes", "yes no"},
		// Ratios all 0.90: range and medians agree, a miss and a met cost.
		{"range and medians agree", []float64{90, 180, 270, 360, 450}, []float64{100, 200, 300, 400, 500}, "**no** no", "yes no"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleReport()
			r.PerRound = map[string]*RoundValues{}
			for name, rounds := range map[string][]float64{NameCompassAllowlist: tt.allowlist, NameCompass: tt.public} {
				v := r.Values[name]
				v[MetricSetups], v[MetricSetupCPU] = Median(rounds), Median(rounds)
				r.Values[name] = v
				r.PerRound[name] = &RoundValues{MetricSetups: rounds, MetricSetupCPU: rounds}
			}
			got := map[string]string{}
			for _, c := range r.Checks() {
				got[c.Want] = c.verdict() + " " + c.noise()
			}
			if g := got["100k allowlist tunnel set-ups/s within 5% of public (≥ 0.95×)"]; g != tt.rate {
				t.Errorf("set-ups: %q, want %q", g, tt.rate)
			}
			if g := got["100k allowlist CPU µs/set-up within 5% of public (≤ 1.05×)"]; g != tt.cpu {
				t.Errorf("CPU per set-up: %q, want %q", g, tt.cpu)
			}
		})
	}
}

func TestWriteMarkdownSpread(t *testing.T) {
	var b strings.Builder
	sampleRounds().WriteMarkdown(&b)
	out := b.String()
	for _, want := range []string{
		// Against direct: 0.80, 0.75, 0.80, 0.82, 0.76.
		"| compass (public) | 0.60× | 0.80× (0.76–0.80) | 0.40× | 4.00× | 4.00× |",
		"| compass (public) ÷ better peer | 1.60× (squid) | 1.33× (tinyproxy; 1.20–1.48) | 2.00× (squid) | 0.40× (squid) | 0.40× (squid) |",
		"| compass (public) ÷ squid | 1.60× | 2.00× (1.83–2.00) | 2.00× | 0.40× | 0.40× |",
		"| compass (100k allowlist) ÷ compass (public) | 0.96× | 0.88× (0.83–1.05) | 0.97× |",
		"| target | measured | met | within noise |",
		"| tunnel set-ups/s ahead of the better peer (> 1×) | 1.33× (1.20–1.48) | yes | no |",
		"| 100k allowlist tunnel set-ups/s within 5% of public (≥ 0.95×) | 0.88× (0.83–1.05) | **no** | yes |",
		"| bulk throughput ≥ 0.5× direct | 0.60× | yes | – |",
		"| ≤ 12 KiB per idle tunnel | 10.0 KiB | yes | – |",
		"In parentheses: the interquartile range of the per-round ratios",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, spreadNote); n != 1 {
		t.Errorf("the spread note appears %d times, want once", n)
	}
}

// TestFormatNear: a value that rounds to its target's threshold is printed with the
// digits that tell them apart, so no row reads "1.50× **no**" against "≥ 1.5×".
func TestFormatNear(t *testing.T) {
	for _, c := range []struct {
		v, threshold float64
		decimals     int
		want         string
	}{
		{1.4966, 1.5, 2, "1.497"},
		{1.5004, 1.5, 2, "1.5004"},
		{1.5, 1.5, 2, "1.50"},
		{1.63, 1.5, 2, "1.63"},
		{1.0499, 1.05, 2, "1.0499"},
		{12.04, 12, 1, "12.04"},
		{11.98, 12, 1, "11.98"},
		{11.7, 12, 1, "11.7"},
		{12.0000001, 12, 1, "12.000000"},
	} {
		if got := formatNear(c.v, c.threshold, c.decimals); got != c.want {
			t.Errorf("formatNear(%v, %v, %d) = %q, want %q", c.v, c.threshold, c.decimals, got, c.want)
		}
	}
	r := sampleReport()
	v := r.Values[NameCompass]
	v[MetricIdleRSS] = 12.03
	r.Values[NameCompass] = v
	for _, c := range r.Checks() {
		if c.Want == "≤ 12 KiB per idle tunnel" && c.Got+" "+c.verdict() != "12.03 KiB **no**" {
			t.Errorf("idle check: %q %s, want 12.03 KiB **no**", c.Got, c.verdict())
		}
	}
}

// withSandbox adds the namespace paths to r: measured with these set-ups and bulk
// values, or skipped for why.
func withSandbox(r *Report, explicit, transparent [2]float64, why string) *Report {
	r.Explicit, r.Transparent = NameExplicit, NameTransparent
	r.Targets = append(r.Targets, NameExplicit, NameTransparent)
	if why != "" {
		r.Skipped = map[string]string{NameExplicit: why, NameTransparent: why}
		return r
	}
	for name, v := range map[string][2]float64{NameExplicit: explicit, NameTransparent: transparent} {
		vals := NoValues()
		vals[MetricSetups], vals[MetricBulk] = v[0], v[1]
		r.Values[name] = vals
	}
	return r
}

func TestTransparentChecks(t *testing.T) {
	const setups, bulk = "transparent tunnel set-ups/s within 10% of explicit (≥ 0.9×)", "transparent bulk throughput within 10% of explicit (≥ 0.9×)"
	tests := []struct {
		name string
		r    *Report
		want map[string]string // check -> measured and verdict
	}{
		{"both met", withSandbox(sampleReport(), [2]float64{1000, 500}, [2]float64{950, 450}, ""),
			map[string]string{setups: "0.95× yes", bulk: "0.90× yes"}},
		{"just short of the threshold shows the digits", withSandbox(sampleReport(), [2]float64{1000, 500}, [2]float64{899, 300}, ""),
			map[string]string{setups: "0.899× **no**", bulk: "0.60× **no**"}},
		{"without root: skipped, not passed", withSandbox(sampleReport(), [2]float64{}, [2]float64{}, skippedNeedsRoot),
			map[string]string{setups: skippedNeedsRoot + " n/a", bulk: skippedNeedsRoot + " n/a"}},
		{"left out of the run: no checks", sampleReport(), map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]string{}
			for _, c := range tt.r.transparentChecks() {
				got[c.Want] = c.Got + " " + c.verdict()
			}
			if len(got) != len(tt.want) {
				t.Fatalf("checks %v, want %v", got, tt.want)
			}
			for k, w := range tt.want {
				if got[k] != w {
					t.Errorf("%s: %q, want %q", k, got[k], w)
				}
			}
		})
	}
}

func TestWriteMarkdownSandboxRows(t *testing.T) {
	tests := []struct {
		name        string
		r           *Report
		contains    []string
		notContains []string
	}{
		{"measured", withSandbox(sampleReport(), [2]float64{1000, 500}, [2]float64{800, 500}, ""),
			[]string{
				"| " + NameTransparent + " | 500 | 800 |",
				"| transparent ÷ explicit (netns) | 1.00× | 0.80× |",
				"| transparent tunnel set-ups/s within 10% of explicit (≥ 0.9×) | 0.80× | **no** |",
			},
			// The namespace paths cross veth links: loopback's direct is no baseline.
			[]string{"| " + NameTransparent + " | 0.13×"}},
		{"without root", withSandbox(sampleReport(), [2]float64{}, [2]float64{}, skippedNeedsRoot),
			[]string{
				"| " + NameExplicit + " | skipped: needs root | – |",
				"| " + NameTransparent + " | skipped: needs root | – |",
				"| transparent bulk throughput within 10% of explicit (≥ 0.9×) | skipped: needs root | n/a |",
			},
			[]string{"transparent ÷ explicit"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			tt.r.WriteMarkdown(&b)
			out := b.String()
			for _, s := range tt.contains {
				if !strings.Contains(out, s) {
					t.Errorf("report lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.notContains {
				if strings.Contains(out, s) {
					t.Errorf("report has %q:\n%s", s, out)
				}
			}
		})
	}
}
