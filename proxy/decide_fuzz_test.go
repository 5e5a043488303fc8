package proxy

import (
	"net/netip"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

// FuzzSameAuthority: the Host comparison never panics, and an authority the proxy can
// decide always names itself.
func FuzzSameAuthority(f *testing.F) {
	for _, seed := range []string{"a.test", "A.Test.:80", "[::1]:443", "127.0.0.1", "xn--bcher-kva.test:8080", "a.test:99999", ""} {
		f.Add(seed, seed, uint16(80))
	}
	f.Fuzz(func(t *testing.T, field, uri string, port uint16) {
		_ = sameAuthority(field, uri, port)
		h, _, reason := splitAuthority(uri, port)
		if reason != "" {
			return
		}
		_, addrErr := netip.ParseAddr(h)
		_, nameErr := policy.CanonicalHostname(h)
		if addrErr == nil || nameErr == nil {
			if !sameAuthority(uri, uri, port) {
				t.Fatalf("%q does not name itself", uri)
			}
		}
	})
}
