package proxybench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nsthread"
)

// Named network namespaces of the benchmark are "proxybench-<role>-<pid>" under
// netnsRunDir, so that `ip netns exec` can start a process in one, and so that a run
// can recognise (and delete) what a killed earlier run left behind.
const (
	netnsPrefix = "proxybench-"
	netnsRunDir = "/run/netns"
)

// namespace is a named network namespace the benchmark created.
type namespace struct {
	Name   string
	Handle netns.NsHandle
}

// netnsName is the name of this process's namespace of role.
func netnsName(role string, pid int) string {
	return fmt.Sprintf("%s%s-%d", netnsPrefix, role, pid)
}

// netnsOwner parses a name netnsName made and returns the pid in it.
func netnsOwner(name string) (pid int, ok bool) {
	rest, ok := strings.CutPrefix(name, netnsPrefix)
	if !ok {
		return 0, false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(rest[i+1:])
	if err != nil || pid <= 0 || strconv.Itoa(pid) != rest[i+1:] {
		return 0, false
	}
	return pid, true
}

// createNamespace creates and names a namespace on a thread that is discarded
// afterwards, so no thread of the benchmark's changes namespace.
func createNamespace(role string) (namespace, error) {
	name := netnsName(role, os.Getpid())
	var h netns.NsHandle
	err := nsthread.Discarded(func() (err error) {
		h, err = netns.NewNamed(name)
		return err
	})
	if err != nil {
		return namespace{}, fmt.Errorf("proxybench: create network namespace %s: %w", name, err)
	}
	return namespace{Name: name, Handle: h}, nil
}

// delete closes the handle and removes the name; the kernel frees the namespace (and
// the links in it) once no socket or process holds it any more.
func (n namespace) delete() error {
	n.Handle.Close()
	if err := netns.DeleteNamed(n.Name); err != nil {
		return fmt.Errorf("proxybench: delete network namespace %s: %w", n.Name, err)
	}
	return nil
}

// sweepNamespaces deletes the namespaces of earlier runs whose process no longer
// runs, and returns their names.
func sweepNamespaces() ([]string, error) {
	entries, err := os.ReadDir(netnsRunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("proxybench: sweep network namespaces: %w", err)
	}
	var swept []string
	var errs []error
	for _, e := range entries {
		pid, ok := netnsOwner(e.Name())
		if !ok || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
			continue // another run, still going, owns it
		}
		if err := netns.DeleteNamed(e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("proxybench: sweep network namespace %s: %w", e.Name(), err))
			continue
		}
		swept = append(swept, e.Name())
	}
	return swept, errors.Join(errs...)
}
