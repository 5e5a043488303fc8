package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nssysctl"
	"github.com/compass-egress/compass-egress/net/nsthread"
	"github.com/compass-egress/compass-egress/net/vethlink"
	"github.com/compass-egress/compass-egress/policy"
)

// The whole transparent path in namespaces the test creates, as the controller wires
// a sandbox: agent ─veth─ sidecar (the nftables table, forwarding off, this proxy's
// listeners) ─veth─ "internet" (a server on 203.0.113.7:22, a documentation address
// that exists only there). A connection from the agent to 203.0.113.7:22, after a
// lookup of git.test through a resolver address of the agent's choice, is redirected
// to the transparent listener, decided by the name the DNS server answered the agent,
// and reaches the server; one to a port no learned name allows is refused (listed under
// the learned name). Nothing
// leaves these namespaces: the proxy's upstream dials are made inside the sidecar's,
// and only to 203.0.113.7.
func TestTransparentPathInNamespaces(t *testing.T) {
	netnstest.RequireRoot(t)
	agent, sidecar, inet := netnstest.New(t, "tagent"), netnstest.New(t, "tside"), netnstest.New(t, "tinet")
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		if err := nssysctl.Set(sidecar.Handle, key, "0"); err != nil {
			t.Fatal(err)
		}
	}
	link := vethlink.Spec{AgentName: "ce-ta0", SidecarName: "ce-ts0",
		AgentAddr: netip.MustParsePrefix("169.254.77.1/30"), SidecarAddr: netip.MustParsePrefix("169.254.77.2/30")}
	outside := vethlink.Spec{AgentName: "ce-ti0", SidecarName: "ce-tu0",
		AgentAddr: netip.MustParsePrefix("203.0.113.7/24"), SidecarAddr: netip.MustParsePrefix("203.0.113.1/24")}
	for _, l := range []struct {
		a, b netnstest.NS
		s    vethlink.Spec
	}{{agent, sidecar, link}, {inet, sidecar, outside}} {
		if err := vethlink.Ensure(l.a.Handle, l.b.Handle, l.s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nftredirect.Ensure(sidecar.Handle, nftredirect.Spec{Interface: link.SidecarName,
		AgentAddr: link.AgentAddr.Addr(), TCPPort: 15001, DNS: netip.AddrPortFrom(link.SidecarAddr.Addr(), 15053)}); err != nil {
		t.Fatal(err)
	}
	server := netnstest.ListenTCP(t, inet, "203.0.113.7:22")
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "SSH-2.0-upstream\r\n")
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	srv := startInNamespace(t, sidecar, startFakeDNS(t, map[string][]netip.Addr{"git.test": {netip.MustParseAddr("203.0.113.7")}}))
	p, err := policy.Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":["git.test:22"]}`))
	if err != nil {
		t.Fatal(err)
	}
	srv.Apply(p, nil, nil, "test")

	if !lookupIn(t, agent, "192.0.2.53:53", "git.test") {
		t.Fatal("git.test not answered through the redirected resolver address")
	}
	c, err := netnstest.Dial(agent, "tcp", "203.0.113.7:22", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(c, "SSH-2.0-agent\r\n"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("SSH-2.0-upstream\r\nSSH-2.0-agent\r\n"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "SSH-2.0-upstream\r\nSSH-2.0-agent\r\n" {
		t.Fatalf("through the sidecar: read %q, %v", got, err)
	}

	refused, err := netnstest.Dial(agent, "tcp", "203.0.113.7:2222", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	_ = refused.SetDeadline(time.Now().Add(hangGuard))
	if b, _ := io.ReadAll(refused); len(b) != 0 {
		t.Fatalf("refused connection read %q", b)
	}
	rs := srv.Current()
	sum := rs.blocked.Summary(rs.Generation)
	if len(sum.Top) != 1 || sum.Top[0].Host != "git.test" || sum.Top[0].Port != 2222 || sum.Top[0].Type != typeTransparent || sum.Top[0].Protocol != "tcp" {
		t.Fatalf("blocked %+v", sum.Top)
	}
}

// startInNamespace starts a proxy whose listeners are bound in ns (the transparent
// port 15001, DNS 15053, the explicit proxy on the sidecar's link address), upstream
// resolver fakeDNS, and whose upstream dials are made in ns, to 203.0.113.7 alone.
func startInNamespace(t *testing.T, ns netnstest.NS, upstream *fakeDNS) *Server {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	srv, err := New(Config{
		Listen: "169.254.77.2:3128", DNSListen: "0.0.0.0:15053", TransparentListen: "0.0.0.0:15001",
		AdminSocket: filepath.Join(t.TempDir(), "admin.sock"), DNSUpstreams: []string{upstream.addr},
		DNSTimeout: time.Second, DrainTimeout: time.Second, ProcRoot: t.TempDir(),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if address != "203.0.113.7:22" {
				return nil, fmt.Errorf("test: refusing to dial %s", address)
			}
			var c net.Conn
			err := nsthread.Run(ns.Handle, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nsthread.Run(ns.Handle, srv.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return srv
}

// lookupIn asks resolver, from inside ns, for name's A records.
func lookupIn(t *testing.T, ns netnstest.NS, resolver, name string) bool {
	t.Helper()
	c, err := netnstest.Dial(ns, "udp", resolver, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	dc := &dns.Conn{Conn: c}
	if err := dc.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	resp, err := dc.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0
}
