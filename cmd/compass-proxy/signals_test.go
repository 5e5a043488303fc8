package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
)

// A SIGTERM is not lost behind SIGHUPs. signal.Notify drops a signal its channel has no
// room for, so while one reload is slow (here it reads --policy, a FIFO, until the test
// writes it) a few more SIGHUPs filled the one channel SIGHUP, SIGTERM and SIGINT shared,
// and the SIGTERM that followed was dropped: the proxy never drained, and went on
// reloading.
func TestSIGTERMNotLostBehindSIGHUPs(t *testing.T) {
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.json")
	sock := filepath.Join(dir, "admin.sock")
	writeFile(t, policyFile, `"no-network"`)
	p := startProxy(t, sock, "--listen", "127.0.0.1:0", "--dns-listen=", "--dns-upstream", "127.0.0.1:1",
		"--policy", policyFile, "--require-no-forwarding=false", "--log-flush-interval=0", "--drain-timeout=2s")
	p.waitUntil(t, "ready", func() bool { code, _ := get(p.admin, "http://admin/readyz"); return code == 200 })

	// The next reload blocks opening the FIFO, then reading it, until the test's write end
	// closes. A write end opened without blocking exists only once the proxy's read end
	// does: from then on the proxy is inside that reload.
	if err := os.Remove(policyFile); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(policyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGHUP)
	var w *os.File
	p.waitUntil(t, "the reload opening the FIFO", func() bool {
		f, err := os.OpenFile(policyFile, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		w = f
		return err == nil
	})
	// More SIGHUPs than the signal channel holds, then SIGTERM. The pauses only let the
	// runtime hand each signal on before the next (it merges signals still pending).
	for range 20 {
		p.signal(t, syscall.SIGHUP)
		time.Sleep(5 * time.Millisecond)
	}
	p.signal(t, syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)

	// Later reloads read a plain file; the one in progress gets "public".
	next := filepath.Join(dir, "next.json")
	writeFile(t, next, `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if err := os.Rename(next, policyFile); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString(`"public"`); err != nil {
		t.Fatal(err)
	}
	w.Close()

	// Either it drains and exits, or (the bug) it is still up after as many reloads as the
	// channel held: generation 1 + 1 + 4. A proxy that kept the SIGTERM stops after at
	// most two reloads.
	stillUp := false
	p.waitUntil(t, "exit or further reloads", func() bool {
		select {
		case <-p.exited:
			return true
		default:
		}
		code, body := get(p.admin, "http://admin/v1/policy")
		var st adminapi.PolicyStatus
		if code == 200 && json.Unmarshal([]byte(body), &st) == nil && st.Generation >= 6 {
			stillUp = true
			return true
		}
		return false
	})
	if stillUp {
		p.fatal(t, "the SIGTERM was lost: still serving at generation 6 after 21 SIGHUPs and a SIGTERM")
	}
	if code := p.wait(t); code != 0 || !strings.Contains(p.logs.String(), `"msg":"draining","signal":"terminated"`) {
		t.Fatalf("exit %d (%s), want 0 after a drain:\n%s", code, p.state, p.logs.String())
	}
}
