package nftredirect_test

import (
	"testing"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nftredirect"
)

// BenchmarkEnsure times each call the controller makes on a switch.
func BenchmarkEnsure(b *testing.B) {
	ns := netnstest.New(b, "nftbench").Handle
	b.Run("create+remove", func(b *testing.B) {
		for b.Loop() {
			if _, err := nftredirect.Ensure(ns, spec); err != nil {
				b.Fatal(err)
			}
			if err := nftredirect.Remove(ns, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	other := spec
	other.TCPPort++
	b.Run("replace", func(b *testing.B) {
		specs := []nftredirect.Spec{spec, other}
		i := 0
		for b.Loop() {
			if changed, err := nftredirect.Ensure(ns, specs[i%2]); err != nil || !changed && i > 0 {
				b.Fatal(changed, err)
			}
			i++
		}
	})
	b.Run("already-there", func(b *testing.B) {
		for b.Loop() {
			if _, err := nftredirect.Ensure(ns, spec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("check", func(b *testing.B) {
		for b.Loop() {
			if _, err := nftredirect.Check(ns, spec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("counters", func(b *testing.B) {
		for b.Loop() {
			if _, err := nftredirect.Counters(ns, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
}
