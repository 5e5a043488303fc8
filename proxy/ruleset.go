package proxy

import (
	"net/http"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/blocked"
	"github.com/compass-egress/compass-egress/proxy/upclient"
)

// RuleSet is one generation of policy in force. It is immutable once published: every
// decision loads the current RuleSet once and uses it throughout, so a decision never
// mixes two policies.
type RuleSet struct {
	Generation uint64
	Policy     policy.Policy
	Matcher    *policy.Matcher
	Digest     string
	Task       string
	Phase      string
	Applied    time.Time

	// addrPorts says which ports the allowlist's address rules could allow.
	addrPorts addrRulePorts
	// blocked counts this generation's refusals (GET /v1/blocked).
	blocked *blocked.Counter
	// upstream and transport carry this generation's forwarded HTTP requests (upstream
	// the plain ones it can, see upclient). Each generation has its own pools, so
	// an upstream connection dialled under one policy is never reused for a request
	// decided under another.
	upstream  *upclient.Client
	transport *http.Transport
}

// closeIdle closes the generation's idle upstream connections.
func (rs *RuleSet) closeIdle() {
	rs.transport.CloseIdleConnections()
	rs.upstream.CloseIdle()
}

// Mode is the policy's network mode.
func (rs *RuleSet) Mode() policy.Mode { return rs.Policy.Mode }

// PolicyMatcher is the matcher, as the DNS server asks for it.
func (rs *RuleSet) PolicyMatcher() *policy.Matcher { return rs.Matcher }
