package vethlink_test

import (
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/vethlink"
)

// BenchmarkEnsure times each call the controller makes on a switch.
func BenchmarkEnsure(b *testing.B) {
	agent, sidecar := netnstest.New(b, "vethbench"), netnstest.New(b, "vethbench")
	b.Run("create+remove", func(b *testing.B) {
		var ensure, remove time.Duration
		for b.Loop() {
			t0 := time.Now()
			if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := vethlink.Remove(agent.Handle, sidecar.Handle, spec); err != nil {
				b.Fatal(err)
			}
			ensure, remove = ensure+t1.Sub(t0), remove+time.Since(t1)
		}
		b.ReportMetric(float64(ensure.Microseconds())/float64(b.N), "ensure-µs/op")
		b.ReportMetric(float64(remove.Microseconds())/float64(b.N), "remove-µs/op")
	})
	if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
		b.Fatal(err)
	}
	b.Run("already-there", func(b *testing.B) {
		for b.Loop() {
			if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("check", func(b *testing.B) {
		for b.Loop() {
			if p, err := vethlink.Check(agent.Handle, sidecar.Handle, spec); err != nil || len(p) != 0 {
				b.Fatal(p, err)
			}
		}
	})
}
