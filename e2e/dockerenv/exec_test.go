package dockerenv

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// Exec runs in the agent with the proxy variables set, Download copies files out, and
// Blocked reports what the sidecar refused under the policy in force.
func TestExecDownloadBlocked(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	e := h.Open(t, h.Provider(t), "exec", allowlist)
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	spec, _ := json.Marshal([]harness.Check{{Name: "blocked", Kind: "proxy", Target: "blocked.test:443", Proxy: proxy}})
	res, err := e.Exec(ctx, []string{"/probe", "check", string(spec)}, controller.ExecOptions{Env: map[string]string{"EXTRA": "1"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	var out []harness.Result
	if err := json.Unmarshal(res.Stdout, &out); err != nil || len(out) != 1 || out[0].Reachable {
		t.Fatalf("probe through Exec: %v %s", err, res.Stdout)
	}
	if res, err := e.Exec(ctx, []string{"/probe", "no-such-command"}, controller.ExecOptions{}); err != nil || res.ExitCode != 2 {
		t.Errorf("failing exec: exit %d, err %v; want exit 2", res.ExitCode, err)
	}

	dst := t.TempDir()
	if err := e.Download(ctx, "/probe", dst); err != nil {
		t.Fatalf("download: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "probe")); err != nil || fi.Size() == 0 {
		t.Errorf("downloaded file: %v", err)
	}

	sum, err := e.Blocked(ctx)
	if err != nil {
		t.Fatalf("blocked: %v", err)
	}
	found := false
	for _, b := range sum.Top {
		found = found || (b.Host == "blocked.test" && b.Port == 443 && b.Count > 0)
	}
	if sum.Total == 0 || !found {
		t.Errorf("blocked summary does not show blocked.test:443: %+v", sum)
	}
	if _, err := e.Apply(ctx, policy.NoNetwork, controller.PhaseLabel{Phase: "evaluation"}); err != nil {
		t.Fatal(err)
	}
	if sum, err := e.Blocked(ctx); err != nil || sum.Total != 0 {
		t.Errorf("a new policy generation starts with no blocked attempts: %+v %v", sum, err)
	}
}
