package adminapi

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/compass-egress/compass-egress/policy"
)

// The admin API's paths. The server routes them by method (PUT and GET PathPolicy,
// GET the others); PathMetrics, PathLivez and PathReadyz are also on the metrics
// listener, if the sidecar has one.
const (
	PathPolicy  = "/v1/policy"
	PathBlocked = "/v1/blocked"
	PathMetrics = "/metrics"
	PathLivez   = "/livez"
	PathReadyz  = "/readyz"
)

// MaxPolicyBody bounds a PUT body. An allowlist of 100k entries is 2 to 5 MiB as the
// controller writes it (names of 15 to 43 bytes) and 25 MiB when every entry is a
// 253-byte name with a port, so 32 MiB holds the largest such list.
const MaxPolicyBody = 32 << 20

// MaxLabelBytes bounds a task or phase label.
const MaxLabelBytes = 128

// LabelRule is what a task or phase label must be, from the admin API or from the
// sidecar's flags: labels go into every decision's log line.
var LabelRule = fmt.Sprintf("must be at most %d bytes of UTF-8 text without control characters", MaxLabelBytes)

// ValidLabel reports whether s keeps LabelRule.
func ValidLabel(s string) bool {
	return len(s) <= MaxLabelBytes && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// PolicyRequest is the envelope form of PUT PathPolicy's body. The server also takes
// the bare wire-format policy, and an envelope without task or phase, which keeps the
// label in force; this client always sends both.
type PolicyRequest struct {
	Policy policy.Policy `json:"policy"`
	Task   string        `json:"task"`
	Phase  string        `json:"phase"`
}

// PolicyStatus is GET PathPolicy's answer: the policy in force, in canonical form.
type PolicyStatus struct {
	Generation uint64        `json:"generation"`
	Digest     string        `json:"digest"`
	Mode       policy.Mode   `json:"mode"`
	Policy     policy.Policy `json:"policy"`
	Task       string        `json:"task"`
	Phase      string        `json:"phase"`
}

// ApplyResult is a successful PUT PathPolicy's answer: the new policy's status and
// what the swap did.
type ApplyResult struct {
	PolicyStatus
	// ClosedConnections counts the live connections the new policy no longer allows,
	// closed before the answer.
	ClosedConnections uint64 `json:"closed_connections"`
	// PreviousBlocked is the outgoing generation's blocked summary, taken atomically
	// with the swap; absent on the first policy a sidecar gets.
	PreviousBlocked *BlockedSummary `json:"previous_blocked,omitempty"`
}

// BlockedSummary is GET PathBlocked's answer: the blocked attempts of one policy
// generation.
type BlockedSummary struct {
	Generation uint64          `json:"generation"`
	Total      uint64          `json:"total"`
	Top        []BlockedTarget `json:"top"`
}

// BlockedTarget is one blocked destination and how often it was tried. Count is exact
// unless Overcount is set: then the destination took the place of others when the
// sidecar's table was full, and Count may exceed its own tries by up to Overcount.
type BlockedTarget struct {
	Host   string `json:"host"`
	Port   uint16 `json:"port"`   // 0 for DNS
	Type   string `json:"type"`   // http, connect, tls, dns or transparent
	Reason string `json:"reason"` // the decision's reason code
	// Protocol is what a transparent connection was read as: tls, http or tcp.
	Protocol  string `json:"protocol,omitempty"`
	Count     uint64 `json:"count"`
	Overcount uint64 `json:"overcount,omitempty"`
}

// Destination is t without its counts: what two lists' entries must share to be counts
// of one destination.
func (t BlockedTarget) Destination() BlockedTarget {
	t.Count, t.Overcount = 0, 0
	return t
}

// ErrorBody is the body of a refused request (4xx): the summary and, for a policy that
// failed validation, each problem.
type ErrorBody struct {
	Error  string   `json:"error"`
	Errors []string `json:"errors"`
}
