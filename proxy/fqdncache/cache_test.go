package fqdncache

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

var (
	agent   = netip.MustParseAddr("169.254.77.1")
	grader  = netip.MustParseAddr("169.254.77.5")
	gitAddr = netip.MustParseAddr("192.0.2.22")
	cdnAddr = netip.MustParseAddr("192.0.2.80")
)

func newCache(lim Limits) (*Cache, *clock) {
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	return New(lim, clk.now), clk
}

func TestNamesFollowTheAnswersTTLAndGrace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration
		want  []string
	}{
		{"within the TTL", 59 * time.Second, []string{"git.test"}},
		{"within the grace", 60*time.Second + 9*time.Second, []string{"git.test"}},
		{"past TTL and grace", 60*time.Second + 10*time.Second, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := newCache(Limits{Grace: 10 * time.Second})
			c.Record(agent, "git.test", []netip.Addr{gitAddr}, time.Minute)
			clk.advance(tc.after)
			if got := c.Names(agent, gitAddr); !slices.Equal(got, tc.want) {
				t.Fatalf("Names after %v = %q, want %q", tc.after, got, tc.want)
			}
		})
	}
}

func TestNamesAreKeptPerClient(t *testing.T) {
	c, _ := newCache(Limits{})
	c.Record(agent, "git.test", []netip.Addr{gitAddr}, time.Minute)
	if got := c.Names(grader, gitAddr); got != nil {
		t.Fatalf("another client sees the agent's answer: %q", got)
	}
	// An IPv4-mapped form of the same client is the same client.
	if got := c.Names(netip.AddrFrom16(agent.As16()), gitAddr); !slices.Equal(got, []string{"git.test"}) {
		t.Fatalf("mapped client address: Names = %q", got)
	}
}

func TestAnAddressSharedByTwoNamesListsBoth(t *testing.T) {
	c, _ := newCache(Limits{})
	c.Record(agent, "model.test", []netip.Addr{cdnAddr}, time.Minute)
	c.Record(agent, "judge.test", []netip.Addr{cdnAddr, gitAddr}, time.Minute)
	if got, want := c.Names(agent, cdnAddr), []string{"judge.test", "model.test"}; !slices.Equal(got, want) {
		t.Fatalf("Names = %q, want %q", got, want)
	}
	if got, want := c.Names(agent, gitAddr), []string{"judge.test"}; !slices.Equal(got, want) {
		t.Fatalf("Names = %q, want %q", got, want)
	}
}

func TestARepeatedAnswerNeverShortensAnExpiry(t *testing.T) {
	c, clk := newCache(Limits{Grace: time.Second})
	c.Record(agent, "git.test", []netip.Addr{gitAddr}, time.Hour)
	c.Record(agent, "git.test", []netip.Addr{gitAddr}, time.Second)
	clk.advance(time.Minute)
	if got := c.Names(agent, gitAddr); len(got) != 1 {
		t.Fatalf("Names = %q after a shorter answer, want the hour-long one kept", got)
	}
}

func TestAHeldAddressOutlivesItsTTLThenTheGrace(t *testing.T) {
	c, clk := newCache(Limits{Grace: 10 * time.Second})
	c.Record(agent, "git.test", []netip.Addr{gitAddr}, time.Minute)
	release := c.Hold(agent, gitAddr)
	clk.advance(time.Hour)
	if got := c.Names(agent, gitAddr); len(got) != 1 {
		t.Fatalf("held for an hour: Names = %q, want git.test", got)
	}
	release()
	release() // idempotent
	clk.advance(9 * time.Second)
	if got := c.Names(agent, gitAddr); len(got) != 1 {
		t.Fatalf("within the grace after release: Names = %q, want git.test", got)
	}
	clk.advance(time.Second)
	if got := c.Names(agent, gitAddr); got != nil {
		t.Fatalf("past the grace after release: Names = %q, want none", got)
	}
}

func TestHoldOfAnUnknownAddressHoldsNothing(t *testing.T) {
	c, _ := newCache(Limits{})
	c.Hold(agent, gitAddr)()
	if got := c.Names(agent, gitAddr); got != nil {
		t.Fatalf("Names = %q", got)
	}
}

func TestBoundsEvictUnheldEntriesFirst(t *testing.T) {
	c, clk := newCache(Limits{AddrsPerClient: 2, NamesPerAddress: 2, Clients: 2})
	a1, a2, a3 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	c.Record(agent, "one.test", []netip.Addr{a1}, time.Minute)
	release := c.Hold(agent, a1)
	c.Record(agent, "two.test", []netip.Addr{a2}, 2*time.Minute)
	clk.advance(time.Second)
	if !c.Record(agent, "three.test", []netip.Addr{a3}, time.Minute) {
		t.Fatal("a third address found no room though one entry was unheld")
	}
	if c.Names(agent, a1) == nil || c.Names(agent, a2) != nil || c.Names(agent, a3) == nil {
		t.Fatalf("after eviction: a1=%q a2=%q a3=%q; want a1 (held) and a3 kept", c.Names(agent, a1), c.Names(agent, a2), c.Names(agent, a3))
	}
	// Names per address: the one expiring first goes.
	c.Record(agent, "x.test", []netip.Addr{a3}, time.Hour)
	c.Record(agent, "y.test", []netip.Addr{a3}, time.Hour)
	if got, want := c.Names(agent, a3), []string{"x.test", "y.test"}; !slices.Equal(got, want) {
		t.Fatalf("names of a3 = %q, want %q", got, want)
	}
	// A held address at its name bound refuses a further name rather than drop one a
	// live connection may need.
	c.Record(agent, "alias.test", []netip.Addr{a1}, time.Hour)
	if c.Record(agent, "third-alias.test", []netip.Addr{a1}, time.Hour) {
		t.Fatal("a held entry at its bound took a third name")
	}
	// Clients: a held client is never evicted; the least recently seen unheld one is.
	c.Record(grader, "g.test", []netip.Addr{a1}, time.Hour)
	other := netip.MustParseAddr("169.254.77.9")
	if !c.Record(other, "o.test", []netip.Addr{a1}, time.Hour) {
		t.Fatal("a third client found no room though the grader's record was unheld")
	}
	if c.Names(grader, a1) != nil || c.Names(agent, a1) == nil {
		t.Fatal("evicted the held client instead of the unheld one")
	}
	release()
}

func TestConcurrentUse(t *testing.T) {
	c, _ := newCache(Limits{AddrsPerClient: 8})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				a := netip.AddrFrom4([4]byte{192, 0, 2, byte(i % 16)})
				c.Record(agent, fmt.Sprintf("n%d.test", g), []netip.Addr{a}, time.Minute)
				release := c.Hold(agent, a)
				c.Names(agent, a)
				release()
			}
		}()
	}
	wg.Wait()
}
