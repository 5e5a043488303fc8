package connio

import "testing"

// panicGate is a Gate whose decision panics.
type panicGate struct{}

func (panicGate) Skips([]byte) bool { return false }

func (panicGate) Feed([]byte) ([]byte, bool, error) { panic("test: the gate panics") }

// A panic in a gate, which runs on a goroutine of its own, reaches the relay's
// goroutine, whose deferred recovery (the proxy's recoverRelay) ends that tunnel alone: it must not end the
// process.
func TestGatePanicReachesRelay(t *testing.T) {
	d := Direction{hello: panicGate{}}
	defer func() {
		if p := recover(); p == nil {
			t.Fatal("no panic reached the relay's goroutine")
		}
	}()
	_, _ = d.pass([]byte{22, 3, 1})
}
