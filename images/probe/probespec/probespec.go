// Package probespec is the probe's JSON protocol: the checks `/probe check SPEC` runs and
// the results it prints. The probe, the Docker controller's verify and the e2e harness
// share it, so that the three cannot drift apart.
package probespec

// Check is one connectivity test. Under the transparent path (restricted modes) the
// sidecar accepts every TCP connection the agent opens and answers every DNS query to
// port 53 of any address, so "reachable" means the destination itself answered. Kinds:
//
//	proxy    fetch https://Target (or http:// for port 80) through the proxy at Proxy;
//	         reachable: the origin answered 200
//	http     GET http://Target/ with no proxy, Host: Host (default Target's host);
//	         reachable: an HTTP answer that is not the sidecar's (no X-Compass-Egress
//	         header); refused: the sidecar's refusal (X-Compass-Egress: denied)
//	tls      a TLS handshake with Target, no proxy, server name Host (default Target's
//	         host), any certificate; reachable: the handshake completed (the sidecar only
//	         relays it: a refused name gets an alert or a close)
//	tcp      dial Target directly; with Expect, reachable: the destination sent first
//	         and its first bytes start with Expect (the sidecar refuses by closing
//	         without a byte); without Expect, reachable: connected, or refused (a reply
//	         came back): under the transparent path, only that the sidecar accepted
//	dns      ask Server (UDP, or TCP with Net "tcp") for QName's A record, with EDNS;
//	         reachable: any DNS reply; resolved: at least one address; refused: the
//	         answer carries the sidecar's Extended DNS Error ("compass-egress: ...")
//	admin    GET Target/v1/policy directly; reachable: a policy document came back
//	spoof    send a UDP query for QName's A record to Target (IPv4) from Source, an
//	         address:port that need not be the probe's, on a raw socket (NET_RAW);
//	         reachable: the datagram was sent (what it caused is the caller's to observe)
//
// With Resolver (tcp, http, tls), Target's host is a name the probe first resolves by
// asking Resolver (UDP) for its A record, then it dials the first address, as a client
// that ignores the proxy variables does; no address: not reachable.
type Check struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Target    string `json:"target,omitempty"`
	Proxy     string `json:"proxy,omitempty"`
	Server    string `json:"server,omitempty"`
	Net       string `json:"net,omitempty"`
	QName     string `json:"qname,omitempty"`
	Source    string `json:"source,omitempty"`
	Host      string `json:"host,omitempty"`
	Resolver  string `json:"resolver,omitempty"`
	Expect    string `json:"expect,omitempty"`
	TimeoutMS int    `json:"timeout_ms,omitempty"`
}

// Result is what a check observed.
type Result struct {
	Name      string `json:"name"`
	Reachable bool   `json:"reachable"`
	Resolved  bool   `json:"resolved,omitempty"`
	Refused   bool   `json:"refused,omitempty"` // the sidecar's own refusal was recognised
	Detail    string `json:"detail"`
}

// The sidecar's refusals, as the probe recognises them: the header of its HTTP answers
// and the text its Extended DNS Errors begin with (written in proxy/forward.go and
// proxy/dnsserver/answer.go).
const (
	RefusalHeader    = "X-Compass-Egress"
	RefusalDenied    = "denied"
	RefusalEDEPrefix = "compass-egress: "
)
