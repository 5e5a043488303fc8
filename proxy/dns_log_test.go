package proxy

import (
	"strings"
	"testing"
)

// TestDNSDecisionLineNamesEveryQtype: a DNS decision line carries the query's type;
// for a type the DNS library has no name for (a private-use type, say) it was empty.
func TestDNSDecisionLineNamesEveryQtype(t *testing.T) {
	h := newHarness(t)
	h.apply(`"no-network"`)
	h.query("private.test", 65280, "udp")
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), `"host":"private.test"`) })
	if logs := h.logs.String(); !strings.Contains(logs, `"qtype":"TYPE65280"`) {
		t.Fatalf("the decision line of a TYPE65280 query: %s", logs)
	}
}
