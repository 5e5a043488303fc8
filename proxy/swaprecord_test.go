package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// gateResolver holds every lookup until the test releases it, then answers addr.
type gateResolver struct {
	got     chan string
	release chan struct{}
	addr    netip.Addr
}

func (g *gateResolver) LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error) {
	g.got <- name
	select {
	case <-g.release:
		return []netip.Addr{g.addr}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestSwapRefusalBelongsToTheNewGeneration: a request decided under one policy and
// refused because a swap came while it was being decided (its lookup stopped, or its
// addresses re-checked) was refused by the new policy. Its 403, its decision line and
// its count in GET /v1/blocked name the new generation; under the old one it was
// counted after the swap had reported the old generation's blocked attempts, so no
// report ever showed it, and the line said "denied by the allowlist policy" of a
// sandbox that was under no-network.
func TestSwapRefusalBelongsToTheNewGeneration(t *testing.T) {
	const name = "swap-record.test"
	cases := []struct {
		name    string
		typ     string
		stopped bool // the swap stops the proxy's own lookup (else the lookup ends and the addresses are re-checked)
	}{
		{"connect, lookup stopped", typeConnect, true},
		{"http, lookup stopped", typeHTTP, true},
		{"connect, re-checked", typeConnect, false},
		{"http, re-checked", typeHTTP, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got <-chan string
			var release chan struct{}
			tune := func(c *Config) {
				gate := startGateDNS(t, dns.RcodeServerFailure)
				c.DNSUpstreams = append([]string{gate.addr}, c.DNSUpstreams...)
				c.DNSTimeout = 5 * time.Second
				got, release = gate.got, gate.release
			}
			if !tc.stopped {
				tune = func(c *Config) {
					g := &gateResolver{got: make(chan string, 1), release: make(chan struct{}), addr: netip.MustParseAddr("127.0.0.2")}
					c.Resolver = g
					got, release = g.got, g.release
				}
			}
			h := newHarness(t, tune)
			h.dns.set(name, netip.MustParseAddr("127.0.0.2"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["` + name + `"]}`)
			type answer struct {
				code   int
				header string
				body   string
			}
			answered := make(chan answer, 1)
			go func() {
				if tc.typ == typeConnect {
					resp, tunnel := h.connect(net.JoinHostPort(name, fmt.Sprint(h.a.echoPort)), "")
					if tunnel != nil {
						tunnel.Close()
					}
					body, _ := io.ReadAll(resp.Body)
					answered <- answer{resp.StatusCode, resp.Header.Get("X-Compass-Egress"), string(body)}
					return
				}
				resp, err := h.client.Get(fmt.Sprintf("http://%s:%d/", name, h.a.httpPort))
				if err != nil {
					t.Error(err)
					answered <- answer{}
					return
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				answered <- answer{resp.StatusCode, resp.Header.Get("X-Compass-Egress"), string(body)}
			}()
			<-got
			res := h.apply(`"no-network"`)
			close(release)
			a := <-answered
			if a.code != http.StatusForbidden {
				t.Fatalf("after the swap: %d %q %q, want 403", a.code, a.header, a.body)
			}
			want := fmt.Sprintf("denied by the no-network policy (generation %d)", res.Generation)
			if !strings.Contains(a.body, want) {
				t.Errorf("403 body %q, want it to say %q", a.body, want)
			}
			_, blocked := h.admin("GET", "/v1/blocked", "")
			if blocked["generation"] != float64(res.Generation) || blocked["total"] != float64(1) || !strings.Contains(fmt.Sprint(blocked["top"]), "host:"+name) {
				t.Errorf("GET /v1/blocked %v: the refusal is not counted under generation %d", blocked, res.Generation)
			}
			line := fmt.Sprintf(`"decision":"denied","reason":%q`, strings.TrimPrefix(a.header, "denied; reason="))
			for _, l := range strings.Split(h.logs.String(), "\n") {
				if strings.Contains(l, line) && strings.Contains(l, `"host":"`+name+`"`) &&
					!strings.Contains(l, fmt.Sprintf(`"mode":"no-network","generation":%d`, res.Generation)) {
					t.Errorf("decision line not under generation %d: %s", res.Generation, l)
				}
			}
		})
	}
}
