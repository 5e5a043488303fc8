package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

func TestFreeSubnets(t *testing.T) {
	pool := netip.MustParsePrefix("10.213.0.0/26") // four /28s
	first := func(int) int { return 0 }
	tests := []struct {
		name string
		used []string
		want []string
	}{
		{"empty", nil, []string{"10.213.0.0/28", "10.213.0.16/28", "10.213.0.32/28", "10.213.0.48/28"}},
		{"one taken", []string{"10.213.0.16/28"}, []string{"10.213.0.0/28", "10.213.0.32/28", "10.213.0.48/28"}},
		{"covered by a wider network", []string{"10.213.0.0/27"}, []string{"10.213.0.32/28", "10.213.0.48/28"}},
		{"pool inside a foreign network", []string{"10.0.0.0/8"}, nil},
		{"unrelated", []string{"172.17.0.0/16"}, []string{"10.213.0.0/28", "10.213.0.16/28", "10.213.0.32/28", "10.213.0.48/28"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var used []netip.Prefix
			for _, u := range tc.used {
				used = append(used, netip.MustParsePrefix(u))
			}
			var got []string
			for _, p := range freeSubnets(pool, 28, used, first) {
				got = append(got, p.String())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("free = %v, want %v", got, tc.want)
			}
		})
	}
	// A random start only rotates the order.
	if got := freeSubnets(pool, 28, nil, func(int) int { return 2 }); got[0].String() != "10.213.0.32/28" || len(got) != 4 {
		t.Errorf("rotated = %v", got)
	}
}

func TestPlanFor(t *testing.T) {
	p := planFor(netip.MustParsePrefix("10.213.1.16/28"))
	if p.Gateway.String() != "10.213.1.17" || p.Sidecar.String() != "10.213.1.18" || p.Agent.String() != "10.213.1.19" {
		t.Errorf("plan = %+v", p)
	}
}

// A concurrent open taking the chosen subnet makes Docker refuse it; the open retries.
func TestNetworkCreateRetriesOnOverlap(t *testing.T) {
	r := newRig(t, "t6")
	r.docker.overlapOnce = true
	e := r.open(t, "t6", policy.NoNetwork)
	if !e.plan.Subnet.IsValid() || !DefaultPool.Contains(e.plan.Subnet.Addr()) {
		t.Errorf("subnet %s not from the pool", e.plan.Subnet)
	}
}

func TestPoolExhausted(t *testing.T) {
	r := newRig(t, "t7")
	r.p.cfg.Pool = netip.MustParsePrefix("10.213.0.0/28")
	r.docker.networks["other"] = &fakeNetwork{name: "other", subnet: "10.213.0.0/24", gateway: "10.213.0.1"}
	_, err := r.p.OpenEnv(context.Background(), controller.EnvSpec{Task: "t7", Image: "agent:1", Baseline: policy.NoNetwork})
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("err = %v, want ErrPoolExhausted", err)
	}
}

func TestAttachable(t *testing.T) {
	running := &container.State{Running: true}
	tests := []struct {
		mode       container.NetworkMode
		state      *container.State
		privileged bool
		caps       []string
		wantErr    string
	}{
		{"bridge", running, false, nil, ""},
		{"my-net", running, false, []string{"NET_RAW", "CHOWN"}, ""},
		{"none", running, false, nil, "network mode none"},
		{"host", running, false, nil, "network mode host"},
		{"container:abc", running, false, nil, "network mode container:abc"},
		{"bridge", &container.State{}, false, nil, "not running"},
		{"bridge", running, true, nil, "is privileged"},
		{"bridge", running, false, []string{"NET_ADMIN"}, "capability NET_ADMIN"},
		{"bridge", running, false, []string{"cap_sys_admin"}, "capability cap_sys_admin"},
		{"bridge", running, false, []string{"ALL"}, "capability ALL"},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			ci := container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{Name: "/x", State: tc.state,
				HostConfig: &container.HostConfig{NetworkMode: tc.mode, Privileged: tc.privileged}}}
			ci.HostConfig.CapAdd = tc.caps
			err := attachable(ci)
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("err = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotAttachable) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want ErrNotAttachable mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateTask(t *testing.T) {
	for _, ok := range []string{"t1", "task_1.a-b", strings.Repeat("a", 63)} {
		if err := ValidateTask(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", "a/b", "a b", strings.Repeat("a", 64), "ü"} {
		if err := ValidateTask(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestUntarStaysInside(t *testing.T) {
	build := func(name string) *bytes.Buffer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte("hi"))
		_ = tw.Close()
		return &buf
	}
	dst := t.TempDir()
	if err := untar(build("out/file.txt"), dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "out", "file.txt")); err != nil || string(b) != "hi" {
		t.Errorf("extracted %q, %v", b, err)
	}
	if err := untar(build("../escape.txt"), dst); err == nil {
		t.Errorf("an entry escaping the destination was extracted")
	}
}

func TestImageDockerfile(t *testing.T) {
	got := ProbeImageSpec("probe:x", "/bin/probe").Dockerfile()
	want := "FROM scratch\nCOPY probe /probe\nENTRYPOINT [\"/probe\"]\nCMD [\"sleep\"]\n"
	if got != want {
		t.Errorf("Dockerfile =\n%s\nwant\n%s", got, want)
	}
	proxy := ProxyImageSpec("compass-proxy:x", "/bin/compass-proxy").Dockerfile()
	for _, line := range []string{"FROM scratch\n", "COPY compass-proxy /compass-proxy\n", "USER 65532:65532\n", `CMD ["/compass-proxy", "healthcheck"]`} {
		if !strings.Contains(proxy, line) {
			t.Errorf("proxy Dockerfile lacks %q:\n%s", line, proxy)
		}
	}
}
