package docker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
