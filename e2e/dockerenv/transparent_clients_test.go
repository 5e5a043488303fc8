package dockerenv

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nsthread"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/transparent"
)

// transparentAllowlist is what the clients' environment opens with: a model, an
// SSH-like host and a package mirror, each on its one port, and silent.test on the
// port of a listener that never speaks (silentPort). The fake internet answers every
// *.test name with its own address, so every name here shares that one address.
var transparentAllowlist = mustParse(`{"network_mode":"allowlist","allowed_hosts":` +
	fmt.Sprintf(`["model.test:443","git.test:22","packages.test:80","silent.test:%d"]}`, silentPort))

// clientsIdleTimeout is the sidecar's tunnel idle bound in the clients' environment:
// short, so that a client that sends nothing is seen closed within the test.
const clientsIdleTimeout = 2 * time.Second

// clientsWorld is one environment whose agent runs the harness's clients image, and a
// decoy: a container of this test on the egress network that no name resolves to, in
// whose namespace the test listens to see that nothing reached it.
type clientsWorld struct {
	e       *docker.Env
	image   string
	fakenet string // the fake internet's address
	decoy   string // the decoy's address
	decoyNS netns.NsHandle
}

// TestTransparentClients runs clients that ignore proxies (busybox wget and nc, a Go
// client with Proxy: nil, a hard-coded resolver) in one allowlist environment, with the
// proxy variables unset: what the policy allows works and reaches the real destination,
// everything else is refused with one /v1/blocked record of type transparent naming
// the protocol, and nothing refused reaches an outside container. The steps share the
// environment and run in order: the first needs an agent that has looked nothing up.
func TestTransparentClients(t *testing.T) {
	h.Need(t)
	t.Parallel()
	image := h.ClientsImage(t)
	ctx := timeout(t, 4*time.Minute)
	cfg := h.Config()
	cfg.ExtraProxyArg = append(cfg.ExtraProxyArg, "--tunnel-idle-timeout", clientsIdleTimeout.String())
	p, err := docker.New(h.Docker, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &clientsWorld{e: h.OpenImage(t, p, "tclients", transparentAllowlist, image), image: image, fakenet: h.Fakenet.String()}
	w.startDecoy(t, ctx)

	for _, step := range []struct {
		name string
		run  func(*testing.T, *clientsWorld)
	}{
		{"co-tenant lookup teaches the agent nothing", testCoTenantLookup},
		{"hard-coded resolver", testHardCodedResolver},
		{"nc", testNC},
		{"wget", testWget},
		{"go client", testGoClient},
		{"server name or host not the address's", testAddressMismatch},
		{"silent client closed by the idle bound", testSilentClient},
		{"udp and icmp dropped", testDropped},
		{"live swap cuts what the new policy refuses", testSwapCuts},
	} {
		t.Run(step.name, func(t *testing.T) { step.run(t, w) })
	}
}

// startDecoy starts the decoy and opens its namespace.
func (w *clientsWorld) startDecoy(t *testing.T, ctx context.Context) {
	t.Helper()
	name := h.Container(ctx, t, "decoy", w.image, &container.HostConfig{NetworkMode: container.NetworkMode(h.EgressNetwork)}, true)
	w.decoy, w.decoyNS = containerNS(t, ctx, name)
}

// containerNS is a running container's address on the egress network and its network
// namespace, closed when the test ends.
func containerNS(t *testing.T, ctx context.Context, name string) (string, netns.NsHandle) {
	t.Helper()
	ci, err := h.Docker.ContainerInspect(ctx, name)
	if err != nil || ci.State == nil || ci.NetworkSettings.Networks[h.EgressNetwork] == nil {
		t.Fatalf("inspect %s: %v", name, err)
	}
	ns, err := netns.GetFromPid(ci.State.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ci.NetworkSettings.Networks[h.EgressNetwork].IPAddress, ns
}

// sh runs script in the agent with no environment but PATH (so no proxy variable) and
// returns what it printed, both streams, and its exit status as a last line "exit=N".
func (w *clientsWorld) sh(t *testing.T, script string) string {
	t.Helper()
	out := shIn(t, w.e.AgentContainer(), script)
	t.Logf("%s\n%s", script, out)
	return out
}

func shIn(t *testing.T, ctr, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := h.Exec(ctx, ctr, "/bin/env", "-i", "PATH=/bin", "/bin/sh", "-c", "{ "+script+"\n} 2>&1; echo \"exit=$?\"")
	if err != nil {
		t.Fatalf("exec %q in %s: %v", script, ctr, err)
	}
	return string(out)
}

// listen counts what arrives at addr ("tcp" or "udp", e.g. ":443") in ns: the
// connections accepted, or the datagrams read.
func listen(t *testing.T, ns netns.NsHandle, network, addr string) (arrived func() int64) {
	t.Helper()
	var n atomic.Int64
	var closer interface{ Close() error }
	err := nsthread.Run(ns, func() error {
		if network == "udp" {
			pc, err := net.ListenPacket("udp4", addr)
			if err == nil {
				closer = pc
				go func() {
					buf := make([]byte, 2048)
					for _, _, err := pc.ReadFrom(buf); err == nil; _, _, err = pc.ReadFrom(buf) {
						n.Add(1)
					}
				}()
			}
			return err
		}
		ln, err := net.Listen("tcp4", addr)
		if err == nil {
			closer = ln
			go func() {
				for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
					n.Add(1)
					c.Close()
				}
			}()
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { closer.Close() })
	return n.Load
}

// assertRefusedOnce finds want among the blocked attempts of the phase in force, with a
// count of one: one record per decision. want.Type is "transparent" unless set.
func (w *clientsWorld) assertRefusedOnce(t *testing.T, want adminapi.BlockedTarget) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if want.Type == "" {
		want.Type = "transparent"
	}
	sum, err := w.e.Blocked(ctx)
	if err != nil {
		t.Fatalf("blocked: %v", err)
	}
	for _, b := range sum.Top {
		if b.Host == want.Host && b.Port == want.Port && b.Type == want.Type && b.Protocol == want.Protocol && b.Reason == want.Reason {
			if b.Count != 1 {
				t.Errorf("blocked %+v counted %d times, want once", want, b.Count)
			}
			return
		}
	}
	t.Errorf("no blocked record %+v among %+v", want, sum.Top)
}

// The sidecar's DNS answers a query sent to any address's port 53, under the policy:
// the allowed name is answered, the refused one REFUSED, and a resolver address that
// is a real container here (the decoy) sees no query. The agent then reaches git.test:22
// by address alone: the sidecar learned the name from its own answer.
func testHardCodedResolver(t *testing.T, w *clientsWorld) {
	udp53, tcp53 := listen(t, w.decoyNS, "udp", ":53"), listen(t, w.decoyNS, "tcp", ":53")
	for _, server := range []string{w.fakenet, w.decoy} {
		out := w.sh(t, "nslookup -type=a git.test "+server)
		if !answered(out, "git.test", w.fakenet) {
			t.Errorf("resolver %s: git.test not answered with %s:\n%s", server, w.fakenet, out)
		}
		if out := w.sh(t, "nslookup -type=a exfil.test "+server); !strings.Contains(out, "REFUSED") {
			t.Errorf("resolver %s: exfil.test not REFUSED:\n%s", server, out)
		}
	}
	if n, m := udp53(), tcp53(); n+m != 0 {
		t.Errorf("the decoy resolver received %d datagrams and %d connections on :53, want none", n, m)
	}
	w.assertDNSRefused(t, "exfil.test")
	if out := w.sh(t, "printf 'hello\\n' | nc "+w.fakenet+" 22"); !strings.HasPrefix(out, "SSH-2.0-fakenet\r\nhello\n") {
		t.Errorf("after the lookup, %s:22 did not answer with the banner and the echo:\n%q", w.fakenet, out)
	}
}

// answered reports whether nslookup's output gives name the address addr.
func answered(out, name, addr string) bool {
	re := regexp.MustCompile(`(?m)^Name:\s*` + regexp.QuoteMeta(name) + `\s*\nAddress:\s*` + regexp.QuoteMeta(addr) + `\s*$`)
	return re.MatchString(out)
}

// assertDNSRefused finds a refused query for name among the blocked attempts.
func (w *clientsWorld) assertDNSRefused(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum, err := w.e.Blocked(ctx)
	if err != nil {
		t.Fatalf("blocked: %v", err)
	}
	for _, b := range sum.Top {
		if b.Type == "dns" && strings.TrimSuffix(b.Host, ".") == name {
			return
		}
	}
	t.Errorf("no blocked DNS record for %s among %+v", name, sum.Top)
}

// busybox nc: the SSH-like exchange with git.test:22 works by name. model.test:22
// works too: the fake internet gives every name one address, so model.test's is
// git.test's, and a connection that names nothing is allowed when any name the agent
// was answered for its address is allowed on its port (a CONNECT to git.test:22 would
// reach the same place). A port no name is allowed on is closed without a byte and
// recorded under the first name learned for the address; exfil.test is not resolved.
func testNC(t *testing.T, w *clientsWorld) {
	for _, name := range []string{"git.test", "model.test"} {
		if out := w.sh(t, "printf 'hello\\n' | nc "+name+" 22"); !strings.HasPrefix(out, "SSH-2.0-fakenet\r\nhello\n") {
			t.Errorf("%s:22 did not answer with the banner and the echo:\n%q", name, out)
		}
	}
	if out := w.sh(t, "sleep 1 | nc git.test 2222"); out != "exit=0\n" {
		t.Errorf("git.test:2222: want closed without a byte, got:\n%q", out)
	}
	w.assertRefusedOnce(t, adminapi.BlockedTarget{Host: "git.test", Port: 2222, Protocol: transparent.TCP, Reason: string(policy.ReasonNotAllowlisted)})
	if out := w.sh(t, "sleep 1 | nc exfil.test 22"); !strings.Contains(out, "bad address") {
		t.Errorf("exfil.test:22: want no address for the name, got:\n%q", out)
	}
}

// busybox wget: the mirror's page comes from the fake internet; exfil.test has no
// address, and a request for it sent to the fake internet's address gets the sidecar's
// 403.
func testWget(t *testing.T, w *clientsWorld) {
	if out := w.sh(t, "wget -q -O - http://packages.test/"); out != "fakenet packages.test\nexit=0\n" {
		t.Errorf("wget http://packages.test/: %q", out)
	}
	if out := w.sh(t, "wget -q -O - http://exfil.test/"); !strings.Contains(out, "bad address") {
		t.Errorf("wget http://exfil.test/: want no address for the name, got %q", out)
	}
	if out := w.sh(t, "wget -O - --header 'Host: exfil.test' http://"+w.fakenet+"/"); !strings.Contains(out, "403 Forbidden") {
		t.Errorf("wget with Host exfil.test: want the sidecar's 403, got %q", out)
	}
	w.assertRefusedOnce(t, adminapi.BlockedTarget{Host: "exfil.test", Port: 80, Protocol: transparent.HTTP, Reason: string(policy.ReasonNotAllowlisted)})
}

// A Go client with Proxy: nil: HTTPS to model.test is answered by the fake internet;
// a ClientHello for exfil.test sent to the same address gets a TLS alert.
func testGoClient(t *testing.T, w *clientsWorld) {
	if out := w.sh(t, "goclient get https://model.test/"); out != "200 OK\nfakenet model.test\nexit=0\n" {
		t.Errorf("goclient https://model.test/: %q", out)
	}
	if out := w.sh(t, "goclient get https://exfil.test/ "+w.fakenet+":443"); !strings.Contains(out, "tls: unrecognized name") {
		t.Errorf("goclient https://exfil.test/: want the sidecar's TLS alert, got %q", out)
	}
	w.assertRefusedOnce(t, adminapi.BlockedTarget{Host: "exfil.test", Port: 443, Protocol: transparent.TLS, Reason: string(policy.ReasonNotAllowlisted)})
}

// UDP (other than to port 53) and ICMP from the agent are dropped in the sidecar and
// counted where `env status` shows them; the decoy receives no datagram.
func testDropped(t *testing.T, w *clientsWorld) {
	ctx := timeout(t, time.Minute)
	udp := listen(t, w.decoyNS, "udp", ":9999")
	before := w.dropped(t, ctx)
	w.sh(t, "goclient udp "+w.decoy+":9999; goclient icmp "+w.decoy)
	// The counters are read after a moment: the datagrams are sent, not acknowledged.
	time.Sleep(200 * time.Millisecond)
	after := w.dropped(t, ctx)
	for _, c := range []nftredirect.Class{nftredirect.ClassUDP, nftredirect.ClassICMP} {
		if after[string(c)].Packets <= before[string(c)].Packets {
			t.Errorf("%s dropped: %d packets before, %d after; want more", c, before[string(c)].Packets, after[string(c)].Packets)
		}
	}
	if n := udp(); n != 0 {
		t.Errorf("the decoy received %d datagrams", n)
	}
}

func (w *clientsWorld) dropped(t *testing.T, ctx context.Context) controller.Drops {
	t.Helper()
	st, err := w.e.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	t.Logf("status: transparent %+v, problems %q", st.Transparent, st.Problems)
	return st.Transparent.Dropped
}

// fileHas polls a file in the agent until it holds every one of want, for up to d.
func (w *clientsWorld) fileHas(t *testing.T, path string, d time.Duration, want ...string) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		out := shIn(t, w.e.AgentContainer(), "cat "+path)
		ok := true
		for _, s := range want {
			ok = ok && strings.Contains(out, s)
		}
		if ok {
			return true
		}
		if time.Now().After(deadline) {
			t.Logf("%s:\n%s", path, out)
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// background starts script in the agent, detached from the exec (every stream
// redirected), with no proxy variable.
func (w *clientsWorld) background(t *testing.T, script string) {
	t.Helper()
	w.sh(t, fmt.Sprintf("( %s ) </dev/null >/dev/null 2>&1 &", script))
}
