package deptest

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/compass-egress/compass-egress"

// rules: no package that roots match may depend, transitively, on a forbidden one. A
// forbidden path covers its sub-packages. sees is a dependency the roots do have, so
// that a rule is known to read the graph it checks.
var rules = []struct {
	name       string
	roots      []string
	forbidden  []string
	stdlibOnly bool
	sees       string
}{
	{
		name:      "the controller does not link the sidecar",
		roots:     []string{mod + "/cmd/compassctl", mod + "/controller/..."},
		forbidden: []string{mod + "/proxy", "github.com/elazarl/goproxy", "github.com/miekg/dns"},
		sees:      "github.com/docker/docker/client",
	},
	{
		name:      "the sidecar does not link the controller or Docker",
		roots:     []string{mod + "/cmd/compass-proxy", mod + "/proxy/..."},
		forbidden: []string{mod + "/controller", "github.com/docker/docker"},
		sees:      "github.com/elazarl/goproxy",
	},
	{
		// The sidecar runs unprivileged: namespaces, links and firewall tables are the
		// controller's to write.
		name:      "the sidecar does not link the namespace, link and firewall code",
		roots:     []string{mod + "/cmd/compass-proxy", mod + "/proxy/..."},
		forbidden: []string{"github.com/vishvananda/netlink", "github.com/vishvananda/netns", "github.com/google/nftables", mod + "/net/egresslink", mod + "/net/nftredirect", mod + "/net/vethlink", mod + "/net/nsthread", mod + "/net/nssysctl"},
		sees:      "github.com/miekg/dns",
	},
	{
		name:       "the address packages both sides link need the standard library only",
		roots:      []string{mod + "/net/addrguard", mod + "/net/dnsaddr"},
		stdlibOnly: true,
		sees:       "net/netip",
	},
}

func TestDependencyRules(t *testing.T) {
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			g := listGraph(t, r.roots)
			for _, p := range r.roots {
				if !slices.ContainsFunc(g.roots, func(root string) bool { return matches(p, root) }) {
					t.Errorf("root pattern %s matches no package", p)
				}
			}
			if _, ok := g.pkgs[r.sees]; !ok {
				t.Errorf("the roots do not depend on %s: the rule is not reading the import graph", r.sees)
			}
			for _, root := range g.roots {
				bad := func(p string) bool {
					if r.stdlibOnly {
						return !g.pkgs[p].standard && !matchesAny(r.roots, p)
					}
					return slices.ContainsFunc(r.forbidden, func(f string) bool { return p == f || strings.HasPrefix(p, f+"/") })
				}
				if chain := g.pathTo(root, bad); chain != nil {
					t.Errorf("%s depends on %s: %s", short(root), short(chain[len(chain)-1]), strings.Join(chain, " -> "))
				}
			}
		})
	}
}

type pkg struct {
	standard bool
	imports  []string
}

type graph struct {
	roots []string
	pkgs  map[string]pkg
}

// listGraph reads the import graph of roots and their dependencies, built as `make
// build` builds (CGO_ENABLED=0), test files excluded: what the binaries link.
func listGraph(t *testing.T, roots []string) graph {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f",
		"{{.ImportPath}} {{.DepOnly}} {{.Standard}}{{range .Imports}} {{.}}{{end}}"}, roots...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := graph{pkgs: map[string]pkg{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			t.Fatalf("go list: unexpected line %q", sc.Text())
		}
		g.pkgs[f[0]] = pkg{standard: f[2] == "true", imports: f[3:]}
		if f[1] == "false" {
			g.roots = append(g.roots, f[0])
		}
	}
	return g
}

// short drops the module path from the module's own packages.
func short(path string) string { return strings.TrimPrefix(path, mod+"/") }

// pathTo returns the import chain from root to the first package bad reports, or nil.
func (g graph) pathTo(root string, bad func(string) bool) []string {
	prev := map[string]string{root: ""}
	for queue := []string{root}; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		if p != root && bad(p) {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append(chain, short(p))
			}
			slices.Reverse(chain)
			return chain
		}
		for _, next := range g.pkgs[p].imports {
			if _, seen := prev[next]; !seen {
				prev[next] = p
				queue = append(queue, next)
			}
		}
	}
	return nil
}

// matches reports whether the go list pattern p (a path, or a path ending in /...)
// matches the import path path.
func matches(p, path string) bool {
	if base, ok := strings.CutSuffix(p, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return p == path
}

func matchesAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return matches(p, path) })
}
