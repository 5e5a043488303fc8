package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case
	args string
}

// dockerfile reads path's instructions; comments and blank lines are dropped.
func dockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// execForm is a JSON-array argument (exec form: no shell, which scratch lacks).
func execForm(t *testing.T, what, args string) []string {
	t.Helper()
	var argv []string
	if err := json.Unmarshal([]byte(args), &argv); err != nil {
		t.Fatalf("%s %s: not the exec form (a JSON array): %v", what, args, err)
	}
	return argv
}

// Dockerfile.proxy builds the image docs/proxy.md describes: FROM scratch and nothing
// else, the static binary, a numeric non-root user owning the admin socket's default
// directory, the OCI labels, and a HEALTHCHECK that runs the binary's own healthcheck.
func TestDockerfileProxy(t *testing.T) {
	const bin = "/compass-proxy"
	ins := dockerfile(t, filepath.Join("..", "..", "Dockerfile.proxy"))
	byCmd := map[string][]string{}
	for _, in := range ins {
		byCmd[in.cmd] = append(byCmd[in.cmd], in.args)
	}
	one := func(cmd string) string {
		t.Helper()
		if len(byCmd[cmd]) != 1 {
			t.Fatalf("%d %s instructions, want 1: %q", len(byCmd[cmd]), cmd, byCmd[cmd])
		}
		return byCmd[cmd][0]
	}

	if from := one("FROM"); from != "scratch" {
		t.Errorf("FROM %s, want scratch (no base image, no other stage)", from)
	}

	user := one("USER")
	ids := regexp.MustCompile(`^([0-9]+)(?::([0-9]+))?$`).FindStringSubmatch(user)
	if ids == nil {
		t.Fatalf("USER %s: want a numeric uid[:gid] (scratch has no /etc/passwd, and a runtime can only check a number is not root)", user)
	}
	if uid, _ := strconv.Atoi(ids[1]); uid == 0 {
		t.Errorf("USER %s: runs as root", user)
	}
	if ids[2] == "0" {
		t.Errorf("USER %s: root group", user)
	}

	// The binary, built static (scratch has no libc), at bin; the admin socket's default
	// directory, owned by the user, since scratch has no /run and the user cannot make one.
	socketDir := filepath.Dir(newFlagSet(&options{}).Lookup("admin-socket").DefValue)
	copies := map[string]bool{}
	for _, c := range byCmd["COPY"] {
		copies[c] = true
	}
	for _, want := range []string{"compass-proxy " + bin, "--chown=" + user + " run-compass " + socketDir} {
		if !copies[want] {
			t.Errorf("no COPY %s among %q", want, byCmd["COPY"])
		}
	}
	mk, err := os.ReadFile(filepath.Join("..", "..", "mk", "proxy.mk"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\tCGO_ENABLED=0 \$\(GO\) build .*-o \$\(BIN\)/compass-proxy \./cmd/compass-proxy$`).Match(mk) {
		t.Errorf("mk/proxy.mk does not build the image's binary with CGO_ENABLED=0")
	}

	labels := strings.Join(byCmd["LABEL"], " ")
	for _, key := range []string{"title", "description", "version", "licenses", "source"} {
		if !regexp.MustCompile(`(^|\s)org\.opencontainers\.image\.` + key + `="[^"]+"`).MatchString(labels) {
			t.Errorf("no org.opencontainers.image.%s label in LABEL %s", key, labels)
		}
	}
	if !strings.Contains(labels, `org.opencontainers.image.version="${VERSION}"`) || !slices.Contains(byCmd["ARG"], "VERSION=dev") {
		t.Errorf("the version label is not the build's VERSION argument: ARG %q, LABEL %s", byCmd["ARG"], labels)
	}

	hc := one("HEALTHCHECK")
	cmd := regexp.MustCompile(`(?:^|\s)CMD\s+(.*)$`).FindStringSubmatch(hc)
	if cmd == nil {
		t.Fatalf("HEALTHCHECK %s: no CMD", hc)
	}
	if argv := execForm(t, "HEALTHCHECK CMD", cmd[1]); strings.Join(argv, " ") != bin+" healthcheck" {
		t.Errorf("HEALTHCHECK CMD %q, want [%q \"healthcheck\"]", argv, bin)
	}
	if argv := execForm(t, "ENTRYPOINT", one("ENTRYPOINT")); strings.Join(argv, " ") != bin {
		t.Errorf("ENTRYPOINT %q, want [%q]", argv, bin)
	}
}
