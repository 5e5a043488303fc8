// Package probespec is the probe's JSON protocol: the checks `/probe check SPEC` runs and
// the results it prints. The probe, the Docker controller's verify and the e2e harness
// share it, so that the three cannot drift apart.
package probespec

// Check is one connectivity test. Kinds:
//
//	proxy    fetch https://Target (or http:// for port 80) through the proxy at Proxy;
//	         reachable: the origin answered 200
//	http     fetch http://Target directly; reachable: any HTTP response
//	tcp      dial Target directly; reachable: connected, or refused (a reply came back)
//	dns      ask Server (UDP, or TCP with Net "tcp") for QName's A record;
//	         reachable: any DNS reply; resolved: at least one address
//	admin    GET Target/v1/policy directly; reachable: a policy document came back
//	spoof    send a UDP query for QName's A record to Target (IPv4) from Source, an
//	         address:port that need not be the probe's, on a raw socket (NET_RAW);
//	         reachable: the datagram was sent (what it caused is the caller's to observe)
type Check struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Target    string `json:"target,omitempty"`
	Proxy     string `json:"proxy,omitempty"`
	Server    string `json:"server,omitempty"`
	Net       string `json:"net,omitempty"`
	QName     string `json:"qname,omitempty"`
	Source    string `json:"source,omitempty"`
	TimeoutMS int    `json:"timeout_ms,omitempty"`
}

// Result is what a check observed.
type Result struct {
	Name      string `json:"name"`
	Reachable bool   `json:"reachable"`
	Resolved  bool   `json:"resolved,omitempty"`
	Detail    string `json:"detail"`
}
