package proxy

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Apply publishes the new rule set before it sweeps the live connections: a connection
// registered after the sweep re-reads the pointer (see tracker.closeIf), so a sweep that
// ran first would miss one that registered under the old set in between. Every cut
// therefore happens with the new set already in force, is counted (the answer and the
// metrics) and leaves nothing behind.
func TestSwapPublishesBeforeItCuts(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct {
		name, policy string
		conns        []string // names of the live connections, all to port 443
		wantClosed   int
	}{
		{"allowlist drops one", `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, []string{"a.test", "b.test"}, 1},
		{"no-network drops all", `"no-network"`, []string{"a.test", "b.test", "c.test"}, 3},
		{"public keeps all", `"public"`, []string{"a.test", "b.test"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h.apply(`"public"`)
			var seen []uint64 // the generation in force at each close
			var conns []*liveConn
			for _, name := range c.conns {
				lc := &liveConn{typ: typeConnect, name: name, addr: netip.MustParseAddr("192.0.2.1"), port: 443}
				lc.close = func() func() {
					seen = append(seen, h.srv.Current().Generation)
					return nil
				}
				conns = append(conns, lc)
				h.srv.tracker.add(lc)
			}
			m := h.srv.metrics
			closedBefore, okBefore := testutil.ToFloat64(m.swapClosed), testutil.ToFloat64(m.reloads.WithLabelValues("success"))
			res := h.apply(c.policy)
			if got := testutil.ToFloat64(m.swapClosed) - closedBefore; got != float64(c.wantClosed) {
				t.Errorf("swap_closed_connections_total rose by %v, want %d", got, c.wantClosed)
			}
			if got := testutil.ToFloat64(m.reloads.WithLabelValues("success")) - okBefore; got != 1 {
				t.Errorf("reloads_total{success} rose by %v, want 1", got)
			}
			if g, ok := testutil.ToFloat64(m.generation), testutil.ToFloat64(m.reloadOK); g != float64(res.Generation) || ok != 1 {
				t.Errorf("policy_generation %v, last_reload_successful %v, want %d and 1", g, ok, res.Generation)
			}
			if res.ClosedConnections != uint64(c.wantClosed) || len(seen) != c.wantClosed {
				t.Fatalf("closed %d (%d closes), want %d", res.ClosedConnections, len(seen), c.wantClosed)
			}
			for _, g := range seen {
				if g != res.Generation {
					t.Errorf("a connection was cut while generation %d was in force, want %d", g, res.Generation)
				}
			}
			if n := h.srv.tracker.len(); n != len(c.conns)-c.wantClosed {
				t.Errorf("%d connections tracked after the swap, want %d", n, len(c.conns)-c.wantClosed)
			}
			for _, lc := range conns {
				h.srv.tracker.remove(lc)
			}
		})
	}
}

// Concurrent applies are serialised: each gets a generation of its own, and the last
// one published is the highest.
func TestConcurrentAppliesGetDistinctGenerations(t *testing.T) {
	h := newHarness(t)
	start := h.srv.Current().Generation
	const workers, each = 8, 50
	gens := make(chan uint64, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				p := []string{`"public"`, `"no-network"`}[w%2]
				gens <- h.apply(p).Generation
			}
		}()
	}
	wg.Wait()
	close(gens)
	seen := map[uint64]bool{}
	for g := range gens {
		if seen[g] || g <= start || g > start+workers*each {
			t.Fatalf("generation %d twice or out of (%d, %d]", g, start, start+workers*each)
		}
		seen[g] = true
	}
	if g := h.srv.Current().Generation; g != start+workers*each {
		t.Fatalf("generation in force %d, want %d", g, start+workers*each)
	}
}

// A connection that ends leaves the tracker: a swap re-decides only live connections,
// and the tracker's memory follows what is open, not what was ever opened.
func TestEndedConnectionsLeaveTheTracker(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	_, tunnel := h.connect(h.a.echoHostPort("a.test"), "")
	echoRoundTrip(t, tunnel, "hello")
	if n := h.srv.tracker.len(); n != 1 {
		t.Fatalf("%d connections tracked with one tunnel open, want 1", n)
	}
	tunnel.Close()
	waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
}
