package docker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
)

// The state-directory check creates nothing: doctor changes nothing.
func TestStateDirUsable(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		ok        bool
		detail    string
	}{
		{"present", base, true, base + " writable"},
		{"absent", filepath.Join(base, "a", "b"), true, filepath.Join(base, "a", "b") + " absent: the first open creates it in " + base},
		{"a file", file, false, file + " is not a directory"},
		{"under a file", filepath.Join(file, "state"), false, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, detail := stateDirUsable(tc.dir)
			if ok != tc.ok || !strings.Contains(detail, tc.detail) {
				t.Errorf("stateDirUsable(%s) = %t, %q; want %t, %q", tc.dir, ok, detail, tc.ok, tc.detail)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(base, "a")); !os.IsNotExist(err) {
		t.Errorf("the check created %s (%v)", filepath.Join(base, "a"), err)
	}
}

// A running container may be removed between doctor's list and its inspection (doctor
// runs beside whatever else uses the engine): the namespace check goes on to the next
// one rather than report nothing checked.
func TestNamespaceAccessSkipsAVanishedContainer(t *testing.T) {
	r := newRig(t, "t1")
	ctx := context.Background()
	for _, name := range []string{"c1", "c2"} {
		if _, err := r.docker.ContainerCreate(ctx, &container.Config{Image: "agent:1", Labels: map[string]string{labelRole: roleSidecar}},
			&container.HostConfig{NetworkMode: "bridge"}, nil, nil, name); err != nil {
			t.Fatal(err)
		}
		if err := r.docker.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
			t.Fatal(err)
		}
		r.docker.containers[name].pid = os.Getpid() // a namespace this test can open
	}
	inspected := 0
	r.docker.inspectErr = func(string) error {
		if inspected++; inspected == 1 {
			return notFound("container")
		}
		return nil
	}
	var detail string
	r.p.checkNamespaceAccess(ctx, func(check string, ok bool, d, _ string) {
		if !ok {
			t.Errorf("%s failed: %s", check, d)
		}
		detail = d
	})
	if !strings.Contains(detail, "can read routes in") {
		t.Errorf("namespace access: %q, want it checked on the container still running", detail)
	}
}
