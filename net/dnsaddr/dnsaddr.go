// Package dnsaddr reads the address of an upstream DNS resolver. The sidecar parses its
// --dns-upstream flags with it, and the controller checks the resolvers it will pass to
// every sidecar by the same rule, without linking the sidecar's DNS server.
package dnsaddr

import (
	"errors"
	"net/netip"
	"strings"
)

// ParseUpstream reads an upstream resolver (--dns-upstream) as ip:port. A bare address gets port 53, as
// resolv.conf writes nameservers; a name is refused, since resolving it would need the
// resolver it names.
func ParseUpstream(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return "", errors.New("port 0: want 1-65535")
		}
		return ap.String(), nil
	}
	bare := s
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		bare = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(bare); err == nil {
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	return "", errors.New("want an IP address with an optional port (10.0.0.2, 10.0.0.2:53, fd00::2, [fd00::2]:53)")
}
