package proxy

import "github.com/compass-egress/compass-egress/proxy/dnsupstream"

// ParseDNSUpstream is dnsupstream.ParseDNSUpstream, for the callers that still name it
// here (the flag parsing of compass-proxy and the controller's config check).
func ParseDNSUpstream(s string) (string, error) { return dnsupstream.ParseDNSUpstream(s) }
