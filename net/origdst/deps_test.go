package origdst

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the sidecar's import of this package small: the
// standard library and golang.org/x/sys only, no netlink or nftables code.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep != "github.com/compass-egress/compass-egress/net/origdst" && !strings.HasPrefix(dep, "golang.org/x/sys/") {
			t.Errorf("origdst depends on %s; only the standard library and golang.org/x/sys are allowed", dep)
		}
	}
}
