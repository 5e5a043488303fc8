package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeProc writes the two forwarding sysctls of a fake ProcRoot.
func writeProc(t *testing.T, proc, ipv4, ipv6 string) {
	t.Helper()
	for path, v := range map[string]string{"sys/net/ipv4/ip_forward": ipv4, "sys/net/ipv6/conf/all/forwarding": ipv6} {
		if err := os.MkdirAll(filepath.Join(proc, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, path), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// expireForwardingCheck makes the next Ready read the sysctls again instead of waiting
// out forwardingCheckEvery.
func expireForwardingCheck(s *Server) {
	s.fwdMu.Lock()
	s.fwd.at = time.Now().Add(-forwardingCheckEvery)
	s.fwdMu.Unlock()
}

// Forwarding turned on or off under a running sidecar changes /readyz: readiness used to
// be computed once in Start.
func TestReadyRechecksForwarding(t *testing.T) {
	for _, startOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "off at start", true: "on at start"}[startOn], func(t *testing.T) {
			proc := t.TempDir()
			set := func(on bool) {
				writeProc(t, proc, map[bool]string{false: "0", true: "1"}[on], "0")
			}
			set(startOn)
			h := newHarness(t, func(c *Config) { c.RequireNoForwarding, c.ProcRoot = true, proc })
			for _, on := range []bool{startOn, !startOn, startOn} {
				set(on)
				expireForwardingCheck(h.srv)
				ok, why := h.srv.Ready()
				if ok == on || (on && !strings.Contains(why, "ip_forward")) {
					t.Fatalf("forwarding on=%v: Ready() = %v, %q", on, ok, why)
				}
				if code, _ := h.admin("GET", "/readyz", ""); (code == 200) == on {
					t.Fatalf("forwarding on=%v: /readyz %d", on, code)
				}
			}
			if !strings.Contains(h.logs.String(), "ready: forwarding is off") {
				t.Fatalf("no log of the change:\n%s", h.logs.String())
			}
			// One error line for the change to on, and one from Start when it was on then.
			want := map[bool]int{false: 1, true: 2}[startOn]
			if n := strings.Count(h.logs.String(), "not ready: this sidecar would route packets"); n != want {
				t.Fatalf("%d lines say not ready, want %d:\n%s", n, want, h.logs.String())
			}
		})
	}
}

// leaveStaleSocket leaves a socket file nobody listens on at path, as a killed proxy does.
func leaveStaleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// A mistyped --admin-socket naming a regular file used to delete that file.
func TestAdminSocketRemovesOnlyASocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Listen: "127.0.0.1:0", AdminSocket: file})
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Start()
	if err == nil || !strings.Contains(err.Error(), "--admin-socket") || !strings.Contains(err.Error(), file+" is a regular file") {
		t.Fatalf("Start: %v, want an error naming --admin-socket and %s", err, file)
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "keep me" {
		t.Fatalf("the file was touched: %q, %v", data, err)
	}

	// A socket a previous run left behind is still replaced.
	stale := filepath.Join(dir, "admin.sock")
	leaveStaleSocket(t, stale)
	h := newHarness(t, func(c *Config) { c.AdminSocket = stale })
	h.socket = stale
	if code, _ := h.admin("GET", "/readyz", ""); code != 200 {
		t.Fatalf("/readyz on a replaced stale socket: %d", code)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	base := func() Config { return Config{Listen: "127.0.0.1:0", AdminSocket: filepath.Join(t.TempDir(), "a.sock")} }
	cases := []struct {
		name string
		tune func(*Config)
		want string
	}{
		{"negative drain", func(c *Config) { c.DrainTimeout = -time.Second }, "Config.DrainTimeout = -1s"},
		{"negative header", func(c *Config) { c.HeaderTimeout = -1 }, "Config.HeaderTimeout"},
		{"negative max connections", func(c *Config) { c.MaxConnections = -1 }, "Config.MaxConnections = -1"},
		{"negative dns inflight", func(c *Config) { c.DNSMaxInflight = -3 }, "Config.DNSMaxInflight = -3"},
		// The labels the admin API refuses (adminEnvelope) are refused at start too.
		{"long task", func(c *Config) { c.Task = strings.Repeat("t", 129) }, "Config.Task"},
		{"control in phase", func(c *Config) { c.Phase = "run\n{\"forged\":1}" }, "Config.Phase"},
		{"invalid UTF-8 task", func(c *Config) { c.Task = "t\xff" }, "Config.Task"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.tune(&c)
			_, err := New(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
	s, err := New(base())
	if err != nil {
		t.Fatal(err)
	}
	c := base()
	c.AdminSocket = ""
	empty, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.Start(); err == nil || !strings.Contains(err.Error(), "Config.AdminSocket is empty") {
		t.Fatalf("Start with no admin socket: %v", err)
	}
	if s.DrainTimeout() != 10*time.Second || s.cfg.DNSMaxInflight != 256 || s.cfg.MaxConnections != 0 {
		t.Fatalf("zero values: drain %s, dns inflight %d, max connections %d", s.DrainTimeout(), s.cfg.DNSMaxInflight, s.cfg.MaxConnections)
	}
	if _, err := os.Stat(base().AdminSocket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("New touched the socket path: %v", err)
	}
	// A policy is loaded, but nothing listens before Start: not ready yet, nor after a
	// Start that failed.
	for name, srv := range map[string]*Server{"before Start": s, "after a failed Start": empty} {
		if ok, why := srv.Ready(); ok || why != "starting" {
			t.Errorf("%s: Ready() = %v, %q, want false, \"starting\"", name, ok, why)
		}
	}
}

// A second sidecar started on the admin socket of one that is running refuses to start:
// that socket is live, not stale. Unlinking it would leave the first sidecar enforcing
// its policy with no way to reach it (a PUT meant for it goes to the second), and the
// first one's exit would then unlink the second's socket (net.UnixListener.Close
// removes the path, whoever bound it last).
func TestAdminSocketInUseIsNotTaken(t *testing.T) {
	first := newHarness(t)
	first.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)

	second, err := New(Config{Listen: "127.0.0.1:0", AdminSocket: first.socket, ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = second.Shutdown(ctx)
		t.Fatal("Start took over the admin socket of a running sidecar")
	} else if !strings.Contains(err.Error(), first.socket) {
		t.Fatalf("Start: %v, want an error naming %s", err, first.socket)
	}
	// The running sidecar still answers on its socket.
	if code, got := first.admin("GET", "/v1/policy", ""); code != 200 || got["mode"] != "allowlist" {
		t.Fatalf("the first sidecar's admin API: %d %v", code, got)
	}
}

// IPv4 forwarding is decided per interface: the kernel forwards a packet received on an
// interface whose conf/<if>/forwarding is 1, whatever ip_forward (conf/all) says
// (ip-sysctl: "whether packets received _on_ this interface can be forwarded"). A
// sidecar whose task-network interface forwards is a router out of the sandbox and must
// not report ready; conf/default is what an interface attached later starts with.
func TestReadinessNeedsEveryInterfaceForwardingOff(t *testing.T) {
	for _, tc := range []struct {
		iface string // the conf/<iface>/forwarding set to 1, "" none
		ready bool
	}{
		{"", true},
		{"eth1", false},
		{"default", false},
	} {
		t.Run(tc.iface, func(t *testing.T) {
			proc := t.TempDir()
			writeProc(t, proc, "0", "0")
			for _, iface := range []string{"all", "default", "lo", "eth0", "eth1"} {
				v := "0\n"
				if iface == tc.iface {
					v = "1\n"
				}
				dir := filepath.Join(proc, "sys/net/ipv4/conf", iface)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "forwarding"), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			h := newHarness(t, func(c *Config) { c.RequireNoForwarding, c.ProcRoot = true, proc })
			if code, _ := h.admin("GET", "/readyz", ""); (code == 200) != tc.ready {
				t.Fatalf("conf/%s/forwarding=1: /readyz %d, want ready=%v", tc.iface, code, tc.ready)
			}
		})
	}
}
