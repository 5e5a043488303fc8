package docker

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestUploadArchive: a saved artifact goes back into a fresh evaluation environment at
// its path, whether the artifact is a file or a directory (Download saves either).
func TestUploadArchive(t *testing.T) {
	saved := t.TempDir()
	files := map[string]string{
		"result.tar":        "tarball",
		"results/a.txt":     "a",
		"results/sub/b.txt": "b",
	}
	for name, body := range files {
		p := filepath.Join(saved, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		src, dstDir string
		want        []string // entries, with the contents of files
	}{
		{"result.tar", "/out", []string{"out/", "out/result.tar=tarball"}},
		{"results", "/work/out", []string{"work/", "work/out/", "work/out/results/",
			"work/out/results/a.txt=a", "work/out/results/sub/", "work/out/results/sub/b.txt=b"}},
		// An artifact at the root: no directory entry for the root itself.
		{"result.tar", "/", []string{"result.tar=tarball"}},
	}
	for _, tc := range tests {
		t.Run(tc.src, func(t *testing.T) {
			buf, err := uploadArchive(filepath.Join(saved, tc.src), tc.dstDir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			tr := tar.NewReader(buf)
			for {
				h, err := tr.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				entry := h.Name
				if h.Typeflag == tar.TypeReg {
					body, err := io.ReadAll(tr)
					if err != nil {
						t.Fatal(err)
					}
					entry += "=" + string(body)
				}
				got = append(got, entry)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("entries\n got  %q\n want %q", got, tc.want)
			}
		})
	}
}

// TestStatParent: the parent PID follows the command name, which may itself hold
// spaces and parentheses.
func TestStatParent(t *testing.T) {
	tests := []struct {
		stat string
		want int
		ok   bool
	}{
		{"42 (agent) S 7 42 42 0", 7, true},
		{"42 (a) b) (c) R 9 42 42 0", 9, true},
		{"42 (agent", 0, false},
		{"42 (agent) S", 0, false},
		{"42 (agent) S x", 0, false},
	}
	for _, tc := range tests {
		got, ok := statParent([]byte(tc.stat))
		if got != tc.want || ok != tc.ok {
			t.Errorf("statParent(%q) = %d, %t; want %d, %t", tc.stat, got, ok, tc.want, tc.ok)
		}
	}
	if got, ok := parentPID(os.Getpid()); !ok || got != os.Getppid() {
		t.Errorf("parentPID(self) = %d, %t; want %d", got, ok, os.Getppid())
	}
}
