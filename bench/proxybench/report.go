package proxybench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Metric is one measured quantity of a target.
type Metric int

// The metrics, in table order.
const (
	MetricBulk       Metric = iota // CONNECT bulk throughput, MB/s (10^6 bytes)
	MetricSetups                   // tunnel set-ups per second
	MetricRequests                 // forward HTTP requests per second
	MetricP50                      // median forward request latency, µs
	MetricP99                      // 99th percentile forward request latency, µs
	MetricIdleRSS                  // resident memory per idle tunnel, KiB
	MetricBulkCPU                  // proxy CPU time per GB of bulk, ms
	MetricSetupCPU                 // proxy CPU time per tunnel set-up, µs
	MetricRequestCPU               // proxy CPU time per forward request, µs
	numMetrics
)

type metricInfo struct {
	title        string
	higherBetter bool
	decimals     int
}

var metricInfos = [numMetrics]metricInfo{
	MetricBulk:       {"CONNECT bulk MB/s", true, 0},
	MetricSetups:     {"tunnel set-ups/s", true, 0},
	MetricRequests:   {"HTTP req/s", true, 0},
	MetricP50:        {"p50 µs", false, 0},
	MetricP99:        {"p99 µs", false, 0},
	MetricIdleRSS:    {"KiB/idle tunnel", false, 1},
	MetricBulkCPU:    {"CPU ms/GB bulk", false, 0},
	MetricSetupCPU:   {"CPU µs/set-up", false, 0},
	MetricRequestCPU: {"CPU µs/request", false, 0},
}

// Values holds one target's metrics; NaN marks one not measured.
type Values [numMetrics]float64

// NoValues is a Values with nothing measured.
func NoValues() Values {
	var v Values
	for i := range v {
		v[i] = math.NaN()
	}
	return v
}

// RoundValues holds one target's value of each metric in each round, in round order, NaN
// for a round that measured nothing: index i is the same round for every target.
type RoundValues [numMetrics][]float64

// Report is the outcome of a run: every target's metrics and the roles the comparison
// rows need. Role fields name a target, or are empty when it was not measured.
type Report struct {
	Targets  []string // in measurement order
	Values   map[string]Values
	PerRound map[string]*RoundValues // for the spread of the ratios; a metric without rounds has none
	Errors   map[string]int64        // failed operations per target
	Notes    []string

	Direct           string
	Compass          string   // compass-proxy with the public policy
	CompassAllowlist string   // compass-proxy with the large allowlist
	Peers            []string // squid, tinyproxy
	// Explicit and Transparent are one compass-proxy's two paths in network namespaces.
	Explicit, Transparent string
	Skipped               map[string]string // target -> why it was not measured
}

func (r *Report) value(target string, m Metric) float64 {
	v, ok := r.Values[target]
	if !ok {
		return math.NaN()
	}
	return v[m]
}

// Spread is the interquartile range, by nearest rank, of the per-round ratios between two
// targets: left's value in round i ÷ right's in round i. Both were measured in the same
// round, under the same state of the machine, so the range shows how much the ratio
// itself moves; pairing the rounds by rank instead would hide that.
type Spread struct {
	Lo, Hi float64
	Rounds int // rounds with both values; fewer than 2 give no spread
}

// spread pairs left's and right's rounds of m, skipping a round either lacks.
func (r *Report) spread(left, right string, m Metric) Spread {
	l, rt := r.PerRound[left], r.PerRound[right]
	if l == nil || rt == nil {
		return Spread{}
	}
	var ratios []float64
	for i := range min(len(l[m]), len(rt[m])) {
		a, b := l[m][i], rt[m][i]
		if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
			continue
		}
		ratios = append(ratios, a/b)
	}
	if len(ratios) < 2 {
		return Spread{}
	}
	return Spread{Lo: Percentile(ratios, 25), Hi: Percentile(ratios, 75), Rounds: len(ratios)}
}

func (s Spread) known() bool { return s.Rounds >= 2 }

func (s Spread) String() string { return fmt.Sprintf("%.2f–%.2f", s.Lo, s.Hi) }

// contains says whether x lies inside the range: then at least a quarter of the rounds
// had a ratio at or below x, and at least a quarter one at or above it.
func (s Spread) contains(x float64) bool { return s.known() && s.Lo <= x && x <= s.Hi }

// ratioCell formats left ÷ right for m: the ratio of the medians and, in parentheses
// after peer (when not empty), the spread of the per-round ratios.
func (r *Report) ratioCell(left, right string, m Metric, peer string) string {
	cell := formatRatio(r.value(left, m), r.value(right, m))
	if cell == "–" {
		return cell
	}
	var extra []string
	if peer != "" {
		extra = append(extra, peer)
	}
	if s := r.spread(left, right, m); s.known() {
		extra = append(extra, s.String())
	}
	if len(extra) > 0 {
		cell += " (" + strings.Join(extra, "; ") + ")"
	}
	return cell
}

// spreadNote explains the parentheses of the ratio tables.
const spreadNote = "Ratios are of the medians (latency: of the percentiles over every round's samples). " +
	"In parentheses: the interquartile range of the per-round ratios, left's value in a round ÷ right's in the same round " +
	"(latency: each round's own percentiles), by nearest rank (of 9 rounds, the 3rd to the 7th smallest ratio; of 15, the 4th to the 12th). " +
	"Both values of a round shared that round's state of the machine; a range that spans 1× means the two swapped places from round to round. " +
	"No range: the metric has no rounds (memory) or fewer than 2 rounds measured both."

// betterPeer returns the peer with the best value of m, or "" if none has one.
func (r *Report) betterPeer(m Metric) string {
	best, bestV := "", math.NaN()
	for _, p := range r.Peers {
		v := r.value(p, m)
		if math.IsNaN(v) {
			continue
		}
		if best == "" || (metricInfos[m].higherBetter && v > bestV) || (!metricInfos[m].higherBetter && v < bestV) {
			best, bestV = p, v
		}
	}
	return best
}

// The two groups of metrics, each printed as its own tables: how fast, and at what cost
// to the proxy's host.
var (
	speedMetrics = []Metric{MetricBulk, MetricSetups, MetricRequests, MetricP50, MetricP99}
	costMetrics  = []Metric{MetricIdleRSS, MetricBulkCPU, MetricSetupCPU, MetricRequestCPU}
)

// WriteMarkdown prints the report as Markdown tables: absolute numbers, ratios against
// direct, ratios between compass-proxy and the peers, and the targets.
func (r *Report) WriteMarkdown(w io.Writer) {
	var b strings.Builder
	absolute := func(metrics []Metric, withErrors bool) {
		var rows [][]string
		for _, t := range r.Targets {
			row := []string{t}
			for i, m := range metrics {
				cell := formatValue(r.value(t, m), metricInfos[m].decimals)
				if why, ok := r.Skipped[t]; ok && i == 0 {
					cell = why
				}
				row = append(row, cell)
			}
			if withErrors {
				row = append(row, fmt.Sprint(r.Errors[t]))
			}
			rows = append(rows, row)
		}
		extra := []string(nil)
		if withErrors {
			extra = []string{"failed ops"}
		}
		writeTable(&b, "target", metrics, extra, rows)
	}
	b.WriteString("### Speed\n\n")
	absolute(speedMetrics, true)
	b.WriteString("\n### Cost to the proxy's host (memory per idle tunnel; proxy CPU time per unit of work)\n\n")
	absolute(costMetrics, false)

	explained := false
	heading := func(h string) {
		b.WriteString("\n### " + h + "\n\n")
		if !explained {
			b.WriteString(spreadNote + "\n\n")
			explained = true
		}
	}
	if r.Direct != "" {
		var rows [][]string
		for _, t := range r.Targets {
			// The namespace paths cross veth links, not loopback: direct is no baseline.
			if t == r.Direct || t == r.Explicit || t == r.Transparent {
				continue
			}
			row := []string{t}
			for _, m := range speedMetrics {
				row = append(row, r.ratioCell(t, r.Direct, m, ""))
			}
			rows = append(rows, row)
		}
		heading("Against direct (target ÷ direct)")
		writeTable(&b, "target", speedMetrics, nil, rows)
	}

	if comps := r.comparisonRows(); len(comps) > 0 {
		for _, group := range [][]Metric{speedMetrics, costMetrics} {
			var rows [][]string
			for _, c := range comps {
				row := []string{c.label}
				for _, m := range group {
					right, peer := c.right, ""
					if right == "" {
						right = r.betterPeer(m)
						peer = right
					}
					row = append(row, r.ratioCell(c.left, right, m, peer))
				}
				rows = append(rows, row)
			}
			if group[0] == speedMetrics[0] {
				heading("Against each other: speed (left ÷ right; rates: higher is better, latency: lower)")
			} else {
				heading("Against each other: cost (left ÷ right; lower is better)")
			}
			writeTable(&b, "comparison", group, nil, rows)
		}
	}

	if checks := r.Checks(); len(checks) > 0 {
		b.WriteString("\n### Targets (issues 3 and 28; reported, not asserted)\n\n" +
			"Met: the ratio of the medians reaches the target. Within noise: the target's threshold lies inside the interquartile range of the per-round ratios " +
			"(in parentheses), so the verdict can go either way from one run to the next; or that range lies wholly on the other side of the threshold, " +
			"so most rounds disagree with the verdict of the medians.\n\n" +
			"| target | measured | met | within noise |\n|---|---:|:---:|:---:|\n")
		for _, c := range checks {
			got := c.Got
			if c.Spread.known() {
				got += " (" + c.Spread.String() + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Want, got, c.verdict(), c.noise())
		}
	}
	for _, n := range r.Notes {
		b.WriteString("\n" + n + "\n")
	}
	io.WriteString(w, b.String())
}

// writeTable writes a Markdown table: a first text column, one right-aligned column per
// metric and per extra title.
func writeTable(b *strings.Builder, first string, metrics []Metric, extra []string, rows [][]string) {
	b.WriteString("| " + first + " |")
	for _, m := range metrics {
		b.WriteString(" " + metricInfos[m].title + " |")
	}
	for _, e := range extra {
		b.WriteString(" " + e + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(metrics)+len(extra)) + "\n")
	for _, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
}

type comparison struct {
	label       string
	left, right string // right == "": the better peer, per metric
}

func (r *Report) comparisonRows() []comparison {
	var rows []comparison
	for _, c := range []string{r.Compass, r.CompassAllowlist} {
		if c == "" {
			continue
		}
		if len(r.Peers) > 1 {
			rows = append(rows, comparison{label: c + " ÷ better peer", left: c})
		}
		for _, p := range r.Peers {
			rows = append(rows, comparison{label: c + " ÷ " + p, left: c, right: p})
		}
	}
	if r.Compass != "" && r.CompassAllowlist != "" {
		rows = append(rows, comparison{label: r.CompassAllowlist + " ÷ " + r.Compass, left: r.CompassAllowlist, right: r.Compass})
	}
	if r.Transparent != "" && r.Explicit != "" && r.Skipped[r.Transparent] == "" {
		rows = append(rows, comparison{label: "transparent ÷ explicit (netns)", left: r.Transparent, right: r.Explicit})
	}
	return rows
}

// Check is one of the performance targets with the measured value.
type Check struct {
	Want      string
	Got       string
	Met       bool
	Skip      bool    // a value it needs was not measured
	Threshold float64 // of a ratio target
	Below     bool    // met at or below Threshold (a cost), not at or above it
	Spread    Spread  // of the per-round ratios; none for a target that is not a ratio
}

func (c Check) verdict() string {
	switch {
	case c.Skip:
		return "n/a"
	case c.Met:
		return "yes"
	}
	return "**no**"
}

// noise says whether the per-round ratios leave the verdict in doubt: the threshold lies
// inside their spread, or the whole spread lies on the other side of the threshold from
// the ratio of the medians, which can happen when the two targets' values do not rise and
// fall together from round to round.
func (c Check) noise() string {
	switch {
	case c.Skip || !c.Spread.known():
		return "–"
	case c.Spread.contains(c.Threshold):
		return "yes"
	}
	spreadMet := c.Spread.Lo > c.Threshold
	if c.Below {
		spreadMet = c.Spread.Hi < c.Threshold
	}
	if spreadMet != c.Met {
		return "yes"
	}
	return "no"
}

// Checks evaluates the targets for compass-proxy.
func (r *Report) Checks() []Check {
	if r.Compass == "" {
		return nil
	}
	c := r.Compass
	var checks []Check
	ratio := func(want string, m Metric, left, right string, min float64, strict bool) {
		checks = append(checks, r.ratioCheck(want, m, left, right, min, strict))
	}
	ratio("bulk throughput ≥ 0.5× direct", MetricBulk, c, r.Direct, 0.5, false)
	ratio("bulk throughput ≥ 1.3× the better peer", MetricBulk, c, r.checkPeer(MetricBulk), 1.3, false)
	for _, m := range []Metric{MetricSetups, MetricRequests} {
		name := metricInfos[m].title
		ratio(name+" ahead of the better peer (> 1×)", m, c, r.checkPeer(m), 1, true)
		ratio(name+" ≥ 1.5× squid", m, c, r.peerNamed("squid"), 1.5, false)
	}
	if v := r.value(c, MetricIdleRSS); math.IsNaN(v) {
		checks = append(checks, Check{Want: "≤ 12 KiB per idle tunnel", Got: "–", Skip: true})
	} else {
		checks = append(checks, Check{Want: "≤ 12 KiB per idle tunnel", Got: formatNear(v, 12, 1) + " KiB", Met: v <= 12})
	}
	checks = append(checks, r.transparentChecks()...)
	if a := r.CompassAllowlist; a != "" {
		for _, m := range []Metric{MetricBulk, MetricSetups, MetricRequests} {
			ratio("100k allowlist "+metricInfos[m].title+" within 5% of public (≥ 0.95×)", m, a, c, 0.95, false)
		}
		// The same comparison in proxy CPU per operation, which the machine's other load
		// disturbs much less than the rates: at most 5% more.
		for _, m := range []Metric{MetricBulkCPU, MetricSetupCPU, MetricRequestCPU} {
			l, p := r.value(a, m), r.value(c, m)
			want := "100k allowlist " + metricInfos[m].title + " within 5% of public (≤ 1.05×)"
			if math.IsNaN(l) || math.IsNaN(p) || p == 0 {
				checks = append(checks, Check{Want: want, Got: "–", Skip: true})
				continue
			}
			checks = append(checks, Check{Want: want, Got: formatNear(l/p, 1.05, 2) + "×", Met: l/p <= 1.05,
				Threshold: 1.05, Below: true, Spread: r.spread(a, c, m)})
		}
	}
	return checks
}

// transparentChecks are the transparent path's targets: within 10% of the
// explicit one, through the same proxy in the same namespaces; a run that could not
// measure them says why instead of passing them.
func (r *Report) transparentChecks() []Check {
	if r.Transparent == "" || r.Explicit == "" {
		return nil
	}
	var checks []Check
	for _, c := range []struct {
		m    Metric
		what string
	}{{MetricSetups, "tunnel set-ups/s"}, {MetricBulk, "bulk throughput"}} {
		want := "transparent " + c.what + " within 10% of explicit (≥ 0.9×)"
		if why := r.Skipped[r.Transparent]; why != "" {
			checks = append(checks, Check{Want: want, Got: why, Skip: true})
			continue
		}
		checks = append(checks, r.ratioCheck(want, c.m, r.Transparent, r.Explicit, 0.9, false))
	}
	return checks
}

// ratioCheck checks left/right ≥ min, or > min when strict.
func (r *Report) ratioCheck(want string, m Metric, left, right string, min float64, strict bool) Check {
	l, rv := r.value(left, m), r.value(right, m)
	if right == "" || math.IsNaN(l) || math.IsNaN(rv) || rv == 0 {
		return Check{Want: want, Got: "–", Skip: true}
	}
	q := l / rv
	return Check{Want: want, Got: formatNear(q, min, 2) + "×", Met: q > min || (!strict && q == min),
		Threshold: min, Spread: r.spread(left, right, m)}
}

// checkPeer is the better of the two peers for m, or "" when either of them has
// no value for m (left out of the run, or no round measured it): a check against "the
// better peer" that silently compared with the only one left would claim more than was
// measured.
func (r *Report) checkPeer(m Metric) string {
	for _, p := range []string{NameSquid, NameTinyproxy} {
		if math.IsNaN(r.value(r.peerNamed(p), m)) {
			return ""
		}
	}
	return r.betterPeer(m)
}

func (r *Report) peerNamed(name string) string {
	for _, p := range r.Peers {
		if p == name {
			return p
		}
	}
	return ""
}

func formatValue(v float64, decimals int) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.*f", decimals, v)
}

// formatNear formats a target's measured value v with decimals digits, or with as many
// more (up to six) as it takes to tell it from the threshold: 1.4966 against 1.5 reads
// 1.497, not a "1.50" beside a verdict that it falls short.
func formatNear(v, threshold float64, decimals int) string {
	for decimals < 6 && v != threshold && formatValue(v, decimals) == formatValue(threshold, decimals) {
		decimals++
	}
	return formatValue(v, decimals)
}

func formatRatio(num, den float64) string {
	if math.IsNaN(num) || math.IsNaN(den) || den == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", num/den)
}
