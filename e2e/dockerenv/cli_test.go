package dockerenv

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"

	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy"
)

// compassctlJSON runs the built compassctl with the harness's environment plus env,
// decodes its --json output into v, and returns its exit code.
func compassctlJSON(t *testing.T, v any, env []string, args ...string) int {
	t.Helper()
	cmd := h.Compassctl(timeout(t, 2*time.Minute), append(args, "--json")...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("compassctl %s: %v", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("compassctl %s: %v in %q", strings.Join(args, " "), err, out)
	}
	return code
}

// doctor runs `compassctl env doctor` and returns its findings by check.
func doctor(t *testing.T, env ...string) (map[string]docker.Finding, int) {
	t.Helper()
	var list []docker.Finding
	code := compassctlJSON(t, &list, env, "env", "doctor")
	out := map[string]docker.Finding{}
	for _, f := range list {
		out[f.Check] = f
	}
	return out, code
}

// doctor on the real engine: every check passes on this host but the egress network,
// which the harness creates with traffic between its containers on (its fake internet
// sits on it) and which the doctor must therefore flag; an absent egress network and a
// missing image are each reported with their fix. `env ls` lists a live environment.
func TestDoctorAndList(t *testing.T) {
	h.Need(t)
	t.Parallel()
	e := h.Open(t, h.Provider(t), "doctor", policy.NoNetwork)

	found, code := doctor(t)
	if code != 1 {
		t.Errorf("doctor exited %d, want 1 (one problem: the egress network)", code)
	}
	for _, check := range []string{"docker reachable", "engine API version", "bridge driver", "proxy image",
		"probe image (verify)", "namespace access", "address pool", "state directory"} {
		if f, ok := found[check]; !ok || !f.OK {
			t.Errorf("doctor %q: %+v (present %t), want ok", check, f, ok)
		}
	}
	if f := found["namespace access"]; !strings.Contains(f.Detail, "can read routes in") {
		t.Errorf("namespace access was not checked on a running container: %q", f.Detail)
	}
	if f := found["egress network"]; f.OK || !strings.Contains(f.Detail, "reach each other") || !strings.Contains(f.Fix, "docker network rm "+h.EgressNetwork) {
		t.Errorf("doctor did not flag the harness's egress network, whose containers reach each other: %+v", f)
	}

	missing := h.Name("missing") + ":none"
	found, code = doctor(t, "COMPASS_EGRESS_NETWORK="+h.Name("absent"), "COMPASS_PROXY_IMAGE="+missing)
	if code != 1 {
		t.Errorf("doctor exited %d, want 1 (one problem: the proxy image)", code)
	}
	if f := found["egress network"]; !f.OK || !strings.Contains(f.Detail, "absent") {
		t.Errorf("an absent egress network: %+v, want ok (the first open creates it)", f)
	}
	if f := found["proxy image"]; f.OK || !strings.Contains(f.Detail, missing+" missing") || !strings.Contains(f.Fix, "image build") {
		t.Errorf("a missing proxy image: %+v, want it named with the fix", f)
	}

	var list []docker.Summary
	if code := compassctlJSON(t, &list, nil, "env", "ls"); code != 0 {
		t.Fatalf("env ls exited %d", code)
	}
	var mine []docker.Summary
	for _, s := range list {
		if s.Task == e.Task() {
			mine = append(mine, s)
		}
	}
	if len(mine) != 1 || mine[0].Env != e.ID() || mine[0].Role != "agent" || mine[0].Sidecar != e.SidecarContainer() || mine[0].State != "running" {
		t.Errorf("env ls lists %+v for task %s, want its one running environment %s", mine, e.Task(), e.ID())
	}
}

// The air-gapped path on the real engine: `env image save` writes the sidecar image to a
// file, `env image load` brings it back after it was removed (same image ID), and an
// environment opens on the loaded image; a damaged archive is refused, naming the file.
func TestImageSaveLoad(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	tag := "compass-e2e-saved:" + h.Name("img")
	if err := h.Docker.ImageTag(ctx, h.ProxyImage, tag); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = h.Docker.ImageRemove(context.Background(), tag, image.RemoveOptions{}) })
	want, err := h.Docker.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "images.tar")
	var saved map[string]any
	if code := compassctlJSON(t, &saved, []string{"COMPASS_PROXY_IMAGE=" + tag}, "env", "image", "save", file); code != 0 {
		t.Fatalf("image save exited %d: %v", code, saved)
	}
	if _, err := h.Docker.ImageRemove(ctx, tag, image.RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Docker.ImageInspect(ctx, tag); err == nil {
		t.Fatalf("%s still present after its removal", tag)
	}
	var loaded map[string]any
	if code := compassctlJSON(t, &loaded, nil, "env", "image", "load", file); code != 0 {
		t.Fatalf("image load exited %d: %v", code, loaded)
	}
	got, err := h.Docker.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatalf("%s after load: %v", tag, err)
	}
	if got.ID != want.ID {
		t.Errorf("loaded %s is %s, saved %s", tag, got.ID, want.ID)
	}

	cfg := h.Config()
	cfg.ProxyImage = tag
	p, err := docker.New(h.Docker, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertState(t, h.Open(t, p, "loaded", allowlist), policy.ModeAllowlist)

	damaged := filepath.Join(t.TempDir(), "damaged.tar")
	if err := os.WriteFile(damaged, []byte("not an image archive"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := h.Compassctl(ctx, "env", "image", "load", damaged).CombinedOutput()
	if err == nil || !strings.Contains(string(out), damaged) {
		t.Errorf("loading a damaged archive: %v, %q; want a failure naming the file", err, out)
	}
}

// `env close --retain` of an environment that does not exist retains nothing and says
// so (it used to print "retained (still running…)"); like every close, it exits 0.
func TestCloseRetainOfNoEnvironment(t *testing.T) {
	h.Need(t)
	t.Parallel()
	task := h.Name("never-opened")
	var got map[string]any
	if code := compassctlJSON(t, &got, nil, "env", "close", "--task", task, "--retain"); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if got["retained"] != false {
		t.Errorf("--json output %v, want retained false", got)
	}
	cmd := h.Compassctl(timeout(t, 2*time.Minute), "env", "close", "--task", task, "--retain")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "no such environment, nothing retained") {
		t.Errorf("env close --retain: %v, output %q, want it to say nothing was retained", err, out)
	}
}
