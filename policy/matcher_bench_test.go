package policy

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDecide measures Decide on allowlists of mixed rules (exact hosts, wildcards,
// IPv4 and IPv6 addresses and CIDRs, a fifth with a port) against a fixed mix of
// destinations that hit each kind of rule or miss. The compiled matcher also reports
// its compile time (wall clock and CPU), its own heap per rule (the policy's heap is
// reported apart) and, where the linear reference ran in the same run, how many times
// faster it decides.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{10, 1_000, 100_000, 1_000_000} {
		w := newBenchWorkload(n)
		var linearNsPerOp float64
		if n <= 1_000 {
			b.Run("linear/rules="+strconv.Itoa(n), func(b *testing.B) {
				linearNsPerOp = runDecide(b, w, linearMatcher{w.policy})
			})
		}
		b.Run("compiled/rules="+strconv.Itoa(n), func(b *testing.B) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start, startCPU := time.Now(), processCPU()
			m := Compile(w.policy)
			compile, compileCPU := time.Since(start), processCPU()-startCPU
			runtime.GC()
			runtime.ReadMemStats(&after)
			w.checkHits(b, m)

			ns := runDecide(b, w, m)
			b.ReportMetric(float64(compile.Microseconds())/1000, "compile-ms")
			b.ReportMetric(float64(compileCPU.Microseconds())/1000, "compile-cpu-ms")
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "matcher-B/rule")
			b.ReportMetric(w.policyBytesPerRule, "policy-B/rule")
			if linearNsPerOp > 0 && ns > 0 {
				b.ReportMetric(linearNsPerOp/ns, "x-faster-than-linear")
			}
			runtime.KeepAlive(m)
		})
	}
}

type benchQuery struct {
	name string
	addr netip.Addr
	port uint16
	hit  bool // a rule covers it by construction
}

type benchWorkload struct {
	policy             Policy
	policyBytesPerRule float64
	queries            []benchQuery // a power of two of them
}

// decider is what the benchmark measures: the compiled matcher or the reference.
type decider interface {
	*Matcher | linearMatcher
	Decide(name string, addr netip.Addr, port uint16) Decision
}

// runDecide decides every query in turn until the benchmark is done and returns ns/op.
// It also reports the process's CPU time per decision (cpu-ns/op), which says more
// than the wall clock on a machine whose other work takes the CPU away.
func runDecide[D decider](b *testing.B, w *benchWorkload, d D) float64 {
	mask := len(w.queries) - 1
	allowed, i := 0, 0
	cpu := processCPU()
	for b.Loop() {
		q := &w.queries[i&mask]
		if d.Decide(q.name, q.addr, q.port).Allowed {
			allowed++
		}
		i++
	}
	b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
	if allowed == 0 {
		b.Fatal("no query was allowed: the workload does not exercise the rules")
	}
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// checkHits makes sure the workload measures matches, not only misses.
func (w *benchWorkload) checkHits(b *testing.B, m *Matcher) {
	for _, q := range w.queries {
		if q.hit && !m.Decide(q.name, q.addr, q.port).Allowed {
			b.Fatalf("Decide(%q, %v, %d) denied a destination the workload built to match", q.name, q.addr, q.port)
		}
	}
}

// processCPU is the CPU time the process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var benchPorts = []uint16{443, 80, 8443, 22}

// newBenchWorkload builds an allowlist of n rules: 30% exact hosts, 15% wildcards,
// 30% IPv4 and 25% IPv6 (each half addresses, half CIDRs), a fifth with a port; and
// 4096 destinations: hits on each kind of rule, and misses.
func newBenchWorkload(n int) *benchWorkload {
	rng := rand.New(rand.NewPCG(uint64(n), 42))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := Policy{Mode: ModeAllowlist, Targets: make([]Target, 0, n)}
	for i := range n {
		var t Target
		switch r := i % 20; {
		case r < 6:
			t = Target{Kind: KindHost, Host: "api-" + strconv.Itoa(i) + ".team" + strconv.Itoa(i%5003) + ".test"}
		case r < 9:
			t = Target{Kind: KindWildcard, Host: "z" + strconv.Itoa(i) + ".corp.test"}
		case r < 15:
			a := netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
			bits := 32
			if r%2 == 1 {
				bits = 16 + rng.IntN(15)
			}
			t = addressTarget(netip.PrefixFrom(a, bits))
		default:
			var a [16]byte
			a[0], a[1], a[2], a[3] = 0x20, 0x01, 0x0d, 0xb8
			for k := 4; k < 16; k++ {
				a[k] = byte(rng.Uint32())
			}
			bits := 128
			if r%2 == 1 {
				bits = 40 + rng.IntN(80)
			}
			t = addressTarget(netip.PrefixFrom(netip.AddrFrom16(a), bits))
		}
		if rng.IntN(5) == 0 {
			t.Port = benchPorts[rng.IntN(len(benchPorts))]
		}
		p.Targets = append(p.Targets, t)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)

	w := &benchWorkload{policy: p, policyBytesPerRule: float64(after.HeapAlloc-before.HeapAlloc) / float64(n)}
	w.queries = make([]benchQuery, 4096)
	for i := range w.queries {
		t := p.Targets[rng.IntN(n)]
		q := benchQuery{port: t.Port, hit: true}
		if q.port == 0 {
			q.port = 443
		}
		switch {
		case i%5 == 4: // a miss: an unknown name and (almost surely) an uncovered address
			q = benchQuery{name: "n" + strconv.Itoa(i) + ".miss.example.test", addr: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), port: 443}
		case t.Kind == KindHost:
			q.name = t.Host
		case t.Kind == KindWildcard:
			q.name = "w" + strconv.Itoa(i) + "." + t.Host
		default:
			q.name = "n" + strconv.Itoa(i) + ".resolved.test"
			q.addr = randomAddrIn(rng, t.Prefix)
		}
		w.queries[i] = q
	}
	return w
}

// randomAddrIn returns a random address of prefix p.
func randomAddrIn(rng *rand.Rand, p netip.Prefix) netip.Addr {
	a := p.Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 12
	}
	for bit := off*8 + p.Bits(); bit < 128; bit++ {
		if rng.IntN(2) == 1 {
			a[bit/8] |= 0x80 >> (bit % 8)
		}
	}
	addr := netip.AddrFrom16(a)
	if p.Addr().Is4() {
		addr = addr.Unmap()
	}
	return addr
}
