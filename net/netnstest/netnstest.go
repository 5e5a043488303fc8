// Package netnstest creates throw-away network namespaces for tests that need
// root, and opens sockets inside them.
//
// Each namespace is named "cetest-<label>-<pid>-<n>" under /run/netns so that a
// leftover from a killed run can be recognised: New first deletes namespaces of
// the same label whose process is gone. Namespaces are removed with t.Cleanup.
// A fresh namespace has no link to any other, so tests may use documentation
// addresses (RFC 5737) inside it without any packet leaving the machine.
package netnstest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nsthread"
)

const (
	prefix  = "cetest-"
	runDir  = "/run/netns"
	labelRE = `^[a-z0-9]{1,20}$`
)

var (
	seq        atomic.Uint64
	validLabel = regexp.MustCompile(labelRE)
)

// NS is a named network namespace a test created.
type NS struct {
	Name   string
	Handle netns.NsHandle
}

// RequireRoot skips t unless the process runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, links and nftables tables")
	}
}

// New creates a namespace for t, removed when t ends. The loopback link is
// left down, as the kernel creates it.
func New(t testing.TB, label string) NS {
	t.Helper()
	RequireRoot(t)
	if !validLabel.MatchString(label) {
		t.Fatalf("netnstest: label %q does not match %s", label, labelRE)
	}
	sweep(t, label)
	name := fmt.Sprintf("%s%s-%d-%d", prefix, label, os.Getpid(), seq.Add(1))
	h, err := newNamed(name)
	if err != nil {
		t.Fatalf("netnstest: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("netnstest: delete namespace %s: %v", name, err)
		}
	})
	return NS{Name: name, Handle: h}
}

// newNamed creates the namespace on a discarded thread (nsthread.Discarded), so the
// test's own threads, the main one included, never change namespace.
func newNamed(name string) (h netns.NsHandle, err error) {
	err = nsthread.Discarded(func() error {
		h, err = netns.NewNamed(name)
		return err
	})
	return h, err
}

// sweep deletes namespaces of this label left by a process that no longer runs.
func sweep(t testing.TB, label string) {
	entries, err := os.ReadDir(runDir)
	if err != nil {
		return // no namespaces yet
	}
	for _, e := range entries {
		pid, ok := leftoverPID(e.Name(), label)
		if !ok || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
			continue // a concurrent run of the same test owns it
		}
		if err := netns.DeleteNamed(e.Name()); err != nil {
			t.Logf("netnstest: sweep leftover namespace %s: %v", e.Name(), err)
		}
	}
}

// leftoverPID parses "cetest-<label>-<pid>-<n>".
func leftoverPID(name, label string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+label+"-")
	if !ok {
		return 0, false
	}
	pidStr, seqStr, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, err := strconv.ParseUint(seqStr, 10, 64); err != nil {
		return 0, false
	}
	return pid, true
}
