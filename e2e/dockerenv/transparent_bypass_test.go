package dockerenv

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/net/nsthread"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy"
	"github.com/compass-egress/compass-egress/proxy/transparent"
)

// Attempts to get past the transparent path's decisions, on the real engine, in the
// clients' environment (TestTransparentClients). The sidecar's unit tests cover the
// rest in-process: an address two names share, a ClientHello split across segments,
// and a DNS answer that has expired (the fake internet's TTL is 5 s, but a learned name
// stays usable for the cache's 30 s grace after it and after every connection to its
// address, and the sidecar has no flag to shorten the grace: an e2e wait would cost
// more than a minute).

// A name the sidecar's DNS answered another client on the task network (a container of
// this test beside the agent, with no link of its own) is not the agent's: the agent's
// connection to git.test's address on :22, made without a lookup of its own, is closed
// without a byte and recorded under the address.
func testCoTenantLookup(t *testing.T, w *clientsWorld) {
	ctx := timeout(t, time.Minute)
	cotenant := h.Container(ctx, t, "cotenant", w.image, &container.HostConfig{NetworkMode: container.NetworkMode(w.e.Network())}, true)
	out := shIn(t, cotenant, "nslookup -type=a git.test "+w.e.SidecarAddr().String())
	t.Logf("co-tenant: nslookup git.test\n%s", out)
	if !answered(out, "git.test", w.fakenet) {
		t.Fatalf("the sidecar did not answer the co-tenant's lookup of git.test with %s", w.fakenet)
	}
	// Now, not at the end: the environment's close removes its network, which must
	// then hold the environment's own containers only.
	if err := h.Docker.ContainerRemove(ctx, cotenant, container.RemoveOptions{Force: true}); err != nil {
		t.Fatalf("remove the co-tenant: %v", err)
	}
	if out := w.sh(t, "sleep 1 | nc "+w.fakenet+" 22"); out != "exit=0\n" {
		t.Errorf("%s:22 with the name learned by another client: want closed without a byte, got %q", w.fakenet, out)
	}
	w.assertRefusedOnce(t, adminapi.BlockedTarget{Host: w.fakenet, Port: 22, Protocol: transparent.TCP, Reason: string(policy.ReasonNotAllowlisted)})
}

// A ClientHello for model.test and a request with Host packages.test, each sent to the
// decoy's address (which neither name resolves to), are refused as mismatches, and
// the decoy sees no connection.
func testAddressMismatch(t *testing.T, w *clientsWorld) {
	tls443, http80 := listen(t, w.decoyNS, "tcp", ":443"), listen(t, w.decoyNS, "tcp", ":80")
	if out := w.sh(t, "goclient get https://model.test/ "+w.decoy+":443"); !strings.Contains(out, "tls: unrecognized name") {
		t.Errorf("SNI model.test to the decoy: want the sidecar's TLS alert, got %q", out)
	}
	w.assertRefusedOnce(t, adminapi.BlockedTarget{Host: "model.test", Port: 443, Protocol: transparent.TLS, Reason: proxy.ReasonSNIAddressMismatch})
	if out := w.sh(t, "wget -O - --header 'Host: packages.test' http://"+w.decoy+"/"); !strings.Contains(out, "403 Forbidden") {
		t.Errorf("Host packages.test to the decoy: want the sidecar's 403, got %q", out)
	}
	w.assertRefusedOnce(t, adminapi.BlockedTarget{Host: "packages.test", Port: 80, Protocol: transparent.HTTP, Reason: proxy.ReasonHostAddressMismatch})
	if a, b := tls443(), http80(); a+b != 0 {
		t.Errorf("the decoy accepted %d connections on :443 and %d on :80, want none", a, b)
	}
}

// silentPort is where a listener of the test, in the fake internet's namespace, takes
// one connection and never writes; transparentAllowlist allows silent.test on it.
const silentPort = 7022

// A client that sends nothing, to an allowed destination that sends nothing either,
// holds its connection for the sidecar's idle bound only: the listener sees the
// connection (decided on the name the agent looked up) end within a few bounds, and
// the client returns long before its input would end.
func testSilentClient(t *testing.T, w *clientsWorld) {
	ctx := timeout(t, time.Minute)
	_, outside := containerNS(t, ctx, h.Prefix+"-fakenet")
	var ln net.Listener
	if err := nsthread.Run(outside, func() (err error) { ln, err = net.Listen("tcp4", ":"+strconv.Itoa(silentPort)); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// How long the connection lived, or why it did not end cleanly (the goroutine may
	// outlive the test: it reports only on the channel).
	type end struct {
		lived time.Duration
		err   error
	}
	ended := make(chan end, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		start := time.Now()
		_ = c.SetReadDeadline(start.Add(30 * time.Second))
		n, err := c.Read(make([]byte, 1))
		if n > 0 {
			err = errors.New("the client sent a byte")
		} else if errors.Is(err, io.EOF) {
			err = nil
		}
		ended <- end{time.Since(start), err}
	}()
	began := time.Now()
	w.sh(t, "mkfifo /tmp/silent && (sleep 30 >/tmp/silent </dev/null 2>&1 &) && nc silent.test "+strconv.Itoa(silentPort)+" </tmp/silent")
	took := time.Since(began)
	select {
	case e := <-ended:
		t.Logf("the silent connection lived %v (idle bound %v); the client returned after %v", e.lived, clientsIdleTimeout, took)
		if e.err != nil || e.lived < clientsIdleTimeout/2 || e.lived > 4*clientsIdleTimeout {
			t.Errorf("the silent connection lived %v and ended with %v; want its end after about the idle bound %v", e.lived, e.err, clientsIdleTimeout)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the listener saw no connection end (the client returned after %v)", took)
	}
	if took > 15*time.Second {
		t.Errorf("the silent client returned after %v, want within a few idle bounds", took)
	}
}
