// Package nsthread runs a function on an OS thread that has entered a network
// namespace, without ever changing the namespace of any other thread.
//
// It follows the rules of the CNI plugins' ns package: the namespace is entered
// only from a goroutine locked to its OS thread, and that goroutine exits
// without unlocking, so the Go runtime destroys the thread instead of handing a
// thread in a foreign namespace back to the scheduler. Goroutines that fn
// starts run on other threads, in the caller's namespace, not in ns.
//
// Prefer an API that takes a namespace file descriptor (netlink.NewHandleAt,
// nftables.WithNetNSFd); use this package only for what has none: sysctls under
// /proc/sys/net and sockets that must be opened inside the namespace.
package nsthread

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The main goroutine keeps the main thread (the thread group leader) for good. A
// goroutine that enters a namespace and exits locked would otherwise land on it now and
// then: the runtime never ends the main thread but parks it for good, still in that
// namespace, and /proc/self/ns/net, which names the leader's, would then name a
// container's (the CNI plugins lock it in init for the same reason).
func init() { runtime.LockOSThread() }

// Discarded calls fn on a new OS thread that is thrown away afterwards, for
// library code that switches its thread's namespace itself and could leave it
// switched on failure (netlink.NewHandleAt moves back to the original
// namespace but unlocks the thread even if that move failed).
func Discarded(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		done <- fn()
	}()
	return <-done
}

// Run calls fn on a new OS thread that has entered ns, waits for it and returns
// its error. The thread is discarded afterwards. Sockets fn opens stay in ns
// and may be used from any goroutine.
func Run(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fmt.Errorf("nsthread: namespace handle is closed")
	}
	return Discarded(func() error {
		if err := unix.Setns(int(ns), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("nsthread: enter network namespace %s: %w", ns, err)
		}
		return fn()
	})
}
