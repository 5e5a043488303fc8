package proxy

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestIdleWatchKeepAliveOrders: a tunnel's watch cuts an idle tunnel whatever the
// order of its keep-alive time and its idle timeout, turns the keep-alive on when the
// tunnel lives past that time and not before (a tunnel active for a while gets checks
// before it), and leaves no timer pending once it has cut the tunnel.
func TestIdleWatchKeepAliveOrders(t *testing.T) {
	for _, tc := range []struct {
		name            string
		idle, keepAfter time.Duration
		active          time.Duration // the clock sees progress this long
		keepAlive       bool          // on when the watch cuts the tunnel
	}{
		{"keep-alive due long before the idle cut", time.Second, time.Millisecond, 0, true},
		{"keep-alive due after the idle cut", 100 * time.Millisecond, time.Hour, 0, false},
		{"checks of an active tunnel before the keep-alive is due", 100 * time.Millisecond, time.Hour, 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, _ := tcpPair(t)
			saved := tunnelKeepAliveAfter
			tunnelKeepAliveAfter = tc.keepAfter // read by start
			var w idleWatch
			w.keepAlive = up
			ended := make(chan any, 1)
			clock := newIdleClock(tc.idle)
			w.start(clock, func(p any) { ended <- p })
			tunnelKeepAliveAfter = saved
			defer w.stop()
			for start := time.Now(); time.Since(start) < tc.active; time.Sleep(10 * time.Millisecond) {
				clock.touch()
			}
			select {
			case p := <-ended:
				if p != nil {
					t.Fatalf("the watch panicked: %v", p)
				}
			case <-time.After(hangGuard):
				t.Fatalf("an idle tunnel (timeout %v, keep-alive after %v) is still open after %v",
					tc.idle, tc.keepAfter, hangGuard)
			}
			if on := tcpSockopt(t, up, unix.SOL_SOCKET, unix.SO_KEEPALIVE) == 1; on != tc.keepAlive {
				t.Errorf("keep-alive on when the tunnel was cut: %v, want %v", on, tc.keepAlive)
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.t.Stop() {
				t.Error("the watch's timer is still pending after it cut the tunnel")
			}
		})
	}
}
