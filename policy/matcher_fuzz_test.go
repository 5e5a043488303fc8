package policy

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// FuzzDecide checks that the compiled matcher agrees with the linear reference (the
// whole Decision: allowed, reason and the rule reported) on policies and destinations
// decoded from the fuzz input. The decoder draws from small alphabets of labels,
// address bytes and ports so that rules overlap, nest and collide often.
func FuzzDecide(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x02\x08\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"))
	f.Add([]byte("\x03\x10\x02\x00\x03\x02\x01\x02\x10\x03\x00\x00\x00\x00\x40\x01\x02\x00\x02\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstReference(t, data)
	})
}

// TestDecideMatchesReference runs the FuzzDecide property on pseudo-random inputs, so
// every test run covers many more policies than the seed corpus.
func TestDecideMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 400)
	for range 3000 {
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		checkAgainstReference(t, data)
		if t.Failed() {
			return
		}
	}
}

// TestDecideMatchesReferenceAtScale compares the matcher with the reference on the
// benchmark's mixed policy, at the edges of every address rule (where the spans of the
// prefix index begin and end) and on every name rule, in both list modes.
func TestDecideMatchesReferenceAtScale(t *testing.T) {
	w := newBenchWorkload(500)
	for _, mode := range []Mode{ModeAllowlist, ModeDenylist} {
		p := Policy{Mode: mode, Targets: w.policy.Targets}
		m, ref := Compile(p), linearMatcher{p}
		check := func(name string, addr netip.Addr, port uint16) {
			if got, want := m.Decide(name, addr, port), ref.Decide(name, addr, port); got != want {
				t.Fatalf("%s: Decide(%q, %v, %d) = %+v, the reference says %+v", mode, name, addr, port, got, want)
			}
		}
		for _, tg := range p.Targets {
			for _, port := range []uint16{0, 443, tg.Port + 1} {
				switch tg.Kind {
				case KindHost:
					check(tg.Host, netip.Addr{}, port)
				case KindWildcard:
					check("x."+tg.Host, netip.Addr{}, port)
					check(tg.Host, netip.Addr{}, port)
				default:
					first := tg.Prefix.Addr()
					last := lastAddr(tg.Prefix)
					for _, a := range []netip.Addr{first, first.Prev(), last, last.Next()} {
						if a.IsValid() {
							check("", a, port)
						}
					}
				}
			}
		}
		for _, q := range w.queries[:512] {
			check(q.name, q.addr, q.port)
		}
	}
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 12
	}
	for bit := off*8 + p.Bits(); bit < 128; bit++ {
		a[bit/8] |= 0x80 >> (bit % 8)
	}
	if p.Addr().Is4() {
		return netip.AddrFrom16(a).Unmap()
	}
	return netip.AddrFrom16(a)
}

func checkAgainstReference(t *testing.T, data []byte) {
	t.Helper()
	in := fuzzInput{data: data}
	p := in.policy()
	m, ref := Compile(p), linearMatcher{p}
	if got, want := m.HasAddressRules(), ref.HasAddressRules(); got != want {
		t.Fatalf("policy %v: HasAddressRules() = %v, the reference says %v", p.Targets, got, want)
	}
	for range 1 + int(in.next()%16) {
		name, addr, port := in.query(p)
		if got, want := m.Decide(name, addr, port), ref.Decide(name, addr, port); got != want {
			t.Fatalf("policy %s %v: Decide(%q, %v, %d) = %+v, the reference says %+v", p.Mode, p.Targets, name, addr, port, got, want)
		}
		if got, want := m.AllowsAddrExplicitly(addr, port), ref.AllowsAddrExplicitly(addr, port); got != want {
			t.Fatalf("policy %s %v: AllowsAddrExplicitly(%v, %d) = %v, the reference says %v", p.Mode, p.Targets, addr, port, got, want)
		}
	}
}

// fuzzInput decodes a policy and destinations from bytes; past the end it reads zeros.
type fuzzInput struct{ data []byte }

func (in *fuzzInput) next() byte {
	if len(in.data) == 0 {
		return 0
	}
	b := in.data[0]
	in.data = in.data[1:]
	return b
}

func (in *fuzzInput) pick(n int) int { return int(in.next()) % n }

var (
	fuzzLabels    = []string{"a", "b", "test", "xn--bcher-kva", "a-b", "0", "_x"}
	fuzzOddNames  = []string{"", ".", "a.", ".a", "a..b", ".test", "a.test.", ".a.test", ".b.a.test", "..a"}
	fuzzPorts     = []uint16{0, 0, 1, 80, 443, 65535}
	fuzzAddrBytes = []byte{0, 1, 2, 10, 127, 128, 254, 255}
	fuzzV6Bases   = []netip.Addr{
		netip.MustParseAddr("2001:db8::"),
		netip.MustParseAddr("::"),
		netip.MustParseAddr("::ffff:0.0.0.0"),
		netip.MustParseAddr("fe80::"),
		netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00"),
	}
	fuzzV6Bits = []int{0, 1, 16, 32, 48, 64, 65, 96, 104, 112, 120, 124, 127, 128}
)

func (in *fuzzInput) policy() Policy {
	p := Policy{Mode: Modes[in.pick(len(Modes))]}
	if p.Mode == ModePublic || p.Mode == ModeNoNetwork {
		return p
	}
	for range in.pick(24) {
		var t Target
		switch in.pick(4) {
		case 0:
			t = Target{Kind: KindHost, Host: in.labels(1 + in.pick(4))}
		case 1:
			t = Target{Kind: KindWildcard, Host: in.labels(1 + in.pick(3))}
		case 2:
			t = addressTarget(netip.PrefixFrom(in.addr4(), in.pick(33)))
		default:
			t = addressTarget(netip.PrefixFrom(in.addr6(), fuzzV6Bits[in.pick(len(fuzzV6Bits))]))
		}
		t.Port = in.port()
		p.Targets = append(p.Targets, t)
	}
	return p
}

func addressTarget(p netip.Prefix) Target {
	p = p.Masked()
	if p.IsSingleIP() {
		return Target{Kind: KindAddr, Prefix: p}
	}
	return Target{Kind: KindPrefix, Prefix: p}
}

func (in *fuzzInput) labels(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fuzzLabels[in.pick(len(fuzzLabels))]
	}
	return strings.Join(parts, ".")
}

func (in *fuzzInput) name() string {
	if b := in.next(); b < 32 {
		return fuzzOddNames[int(b)%len(fuzzOddNames)]
	}
	return in.labels(1 + in.pick(5))
}

// query draws a destination: half of the time one derived from a rule of p (its name,
// a name under its wildcard, an address at or next to the edges of its prefix, or inside
// it), so that rules are hit often and at their boundaries.
func (in *fuzzInput) query(p Policy) (string, netip.Addr, uint16) {
	b := in.next()
	if b < 128 || len(p.Targets) == 0 {
		return in.name(), in.addr(), in.port()
	}
	t := p.Targets[int(b)%len(p.Targets)]
	name, addr, port := in.name(), in.addr(), in.port()
	switch t.Kind {
	case KindHost:
		name = t.Host
	case KindWildcard:
		name = in.labels(1+in.pick(2)) + "." + t.Host
	case KindAddr, KindPrefix:
		switch in.pick(5) {
		case 0:
			addr = t.Prefix.Addr().Prev()
		case 1:
			addr = t.Prefix.Addr()
		case 2:
			addr = lastAddr(t.Prefix)
		case 3:
			addr = lastAddr(t.Prefix).Next()
		default:
			addr = in.addrIn(t.Prefix)
		}
	}
	return name, addr, port
}

// addrIn returns an address of prefix p whose host bits come from the input.
func (in *fuzzInput) addrIn(p netip.Prefix) netip.Addr {
	a := p.Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 12
	}
	for i := off + p.Bits()/8; i < 16; i++ {
		keep := byte(0)
		if i == off+p.Bits()/8 {
			keep = ^byte(0xff >> (p.Bits() % 8))
		}
		a[i] = a[i]&keep | in.next()&^keep
	}
	if p.Addr().Is4() {
		return netip.AddrFrom16(a).Unmap()
	}
	return netip.AddrFrom16(a)
}

func (in *fuzzInput) port() uint16 { return fuzzPorts[in.pick(len(fuzzPorts))] }

func (in *fuzzInput) addr4() netip.Addr {
	var a [4]byte
	for i := range a {
		a[i] = fuzzAddrBytes[in.pick(len(fuzzAddrBytes))]
	}
	return netip.AddrFrom4(a)
}

func (in *fuzzInput) addr6() netip.Addr {
	a := fuzzV6Bases[in.pick(len(fuzzV6Bases))].As16()
	for _, i := range []int{5, 11, 12, 15} {
		a[i] |= fuzzAddrBytes[in.pick(len(fuzzAddrBytes))]
	}
	return netip.AddrFrom16(a)
}

func (in *fuzzInput) addr() netip.Addr {
	switch in.pick(6) {
	case 0:
		return netip.Addr{}
	case 1, 2:
		return in.addr4()
	case 3:
		return netip.AddrFrom16(in.addr4().As16()) // IPv4-mapped
	case 4:
		return in.addr6().WithZone("eth0")
	}
	return in.addr6()
}
