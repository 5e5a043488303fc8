package nsthread_test

import (
	"errors"
	"testing"

	"github.com/vishvananda/netns"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nsthread"
)

// procSelfNS is /proc/self/ns/net (the main thread's) before any test ran.
var procSelfNS netns.NsHandle

func TestMain(m *testing.M) {
	var err error
	if procSelfNS, err = netns.GetFromPath("/proc/self/ns/net"); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

func TestRun(t *testing.T) {
	target := netnstest.New(t, "nsthread")
	own, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	errBoom := errors.New("boom")

	tests := []struct {
		name    string
		fn      func() error
		wantErr error
	}{
		{"returns nil", func() error { return nil }, nil},
		{"returns fn's error", func() error { return errBoom }, errBoom},
		{"runs in the namespace", func() error {
			cur, err := netns.Get()
			if err != nil {
				return err
			}
			defer cur.Close()
			if !cur.Equal(target.Handle) || cur.Equal(own) {
				return errors.New("thread is not in the requested namespace")
			}
			return nil
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := nsthread.Run(target.Handle, tt.fn); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Run() = %v, want %v", err, tt.wantErr)
			}
			after, err := netns.Get()
			if err != nil {
				t.Fatal(err)
			}
			defer after.Close()
			if !after.Equal(own) {
				t.Fatal("the caller's thread changed namespace")
			}
		})
	}
}

func TestRunClosedHandle(t *testing.T) {
	if err := nsthread.Run(netns.None(), func() error { return nil }); err == nil {
		t.Fatal("Run(closed handle) = nil, want an error")
	}
}

// TestDiscardedKeepsTheCallersThread: fn may leave its thread in another
// namespace; the caller's thread is not that thread.
func TestDiscardedKeepsTheCallersThread(t *testing.T) {
	target := netnstest.New(t, "nsthread")
	own, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	err = nsthread.Discarded(func() error { return netns.Set(target.Handle) })
	if err != nil {
		t.Fatal(err)
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(own) {
		t.Fatal("the caller's thread changed namespace")
	}
}

// The process's namespace (/proc/self/ns/net: the main thread's) is never one that Run
// entered, however often Run is called: a goroutine of Run's that lands on the main
// thread would leave it parked in ns for good.
func TestRunLeavesTheMainThreadHome(t *testing.T) {
	target := netnstest.New(t, "nsthreadmain")
	for i := range 300 {
		if err := nsthread.Run(target.Handle, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		self, err := netns.GetFromPath("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		entered := self.Equal(target.Handle)
		self.Close()
		if entered {
			t.Fatalf("after %d calls, /proc/self/ns/net is the namespace Run entered", i+1)
		}
	}
}
