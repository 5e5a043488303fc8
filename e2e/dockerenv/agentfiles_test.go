package dockerenv

import (
	"archive/tar"
	"bytes"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// readAgentFile reads one file out of a container through the engine's archive API
// (the probe image has no shell to cat it with).
func readAgentFile(t *testing.T, ctr, path string) string {
	t.Helper()
	ctx := timeout(t, time.Minute)
	rc, _, err := h.Docker.CopyFromContainer(ctx, ctr, path)
	if err != nil {
		t.Fatalf("copy %s out of %s: %v", path, ctr, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		t.Fatalf("archive of %s: %v", path, err)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The resolver the agent's own configuration names is the sidecar, over UDP and TCP:
// it resolves what the policy allows, refuses the rest, and answers nothing under
// no-network.
func TestAgentResolverIsTheSidecar(t *testing.T) {
	h.Need(t)
	t.Parallel()
	e := h.Open(t, h.Provider(t), "resolv", allowlist)
	var servers []string
	for _, line := range strings.Split(readAgentFile(t, e.AgentContainer(), "/etc/resolv.conf"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
			servers = append(servers, f[1])
		}
	}
	if len(servers) == 0 {
		t.Fatal("the agent's /etc/resolv.conf names no nameserver")
	}
	t.Logf("the agent's nameservers: %v (sidecar %s)", servers, e.SidecarAddr())
	run := func(mode policy.Mode) {
		var checks []harness.Check
		for _, s := range servers {
			server := netip.AddrPortFrom(netip.MustParseAddr(s), 53).String()
			for _, nw := range []string{"udp", "tcp"} {
				for _, name := range []string{"allowed", "blocked"} {
					checks = append(checks, harness.Check{Name: s + "/" + nw + "/" + name, Kind: "dns",
						Server: server, Net: nw, QName: name + ".test", TimeoutMS: 3000})
				}
			}
		}
		res, err := h.ExecProbe(timeout(t, 2*time.Minute), e.AgentContainer(), checks)
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		for _, c := range checks {
			r := res[c.Name]
			want := mode == policy.ModeAllowlist && strings.HasSuffix(c.Name, "/allowed")
			if r.Resolved != want {
				t.Errorf("%s: the agent's resolver %s resolved=%t, want %t (%s)", mode, c.Name, r.Resolved, want, r.Detail)
			}
		}
	}
	run(policy.ModeAllowlist)
	if _, err := e.Apply(timeout(t, 2*time.Minute), policy.NoNetwork, controller.PhaseLabel{Phase: "run"}); err != nil {
		t.Fatalf("switch: %v", err)
	}
	run(policy.ModeNoNetwork)
}

// Downloading an agent's directory copies its regular files and nothing the agent could
// aim elsewhere: its symbolic links, to absolute paths or up out of the directory, are
// not created on the host, and nothing appears outside the destination.
func TestDownloadKeepsLinksOut(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 2*time.Minute)
	e := h.Open(t, h.Provider(t), "download", policy.NoNetwork)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, hd := range []*tar.Header{
		{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "out/result.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
		{Name: "out/abs", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		{Name: "out/up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../tmp"},
		{Name: "out/sub/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "out/sub/passwd", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
	} {
		if err := tw.WriteHeader(hd); err != nil {
			t.Fatal(err)
		}
		if hd.Size > 0 {
			_, _ = tw.Write([]byte("ok\n"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Docker.CopyToContainer(ctx, e.AgentContainer(), "/", &buf, container.CopyToContainerOptions{}); err != nil {
		t.Fatalf("put the agent's files: %v", err)
	}

	parent := t.TempDir()
	dst := filepath.Join(parent, "artifacts")
	if err := e.Download(ctx, "/out", dst); err != nil {
		t.Fatalf("download: %v", err)
	}
	var got []string
	err := filepath.Walk(parent, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(parent, path)
		kind := "file"
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			kind = "link"
		case info.IsDir():
			kind = "dir"
		}
		got = append(got, kind+" "+rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"dir .", "dir artifacts", "dir artifacts/out", "file artifacts/out/result.txt", "dir artifacts/out/sub"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("downloaded tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if b, err := os.ReadFile(filepath.Join(dst, "out", "result.txt")); err != nil || string(b) != "ok\n" {
		t.Errorf("result.txt: %q, %v", b, err)
	}
}
