package policy

import (
	"os"
	"strings"
	"testing"
)

// The three statements of the harness guide ("Tell the Agent About Rollout
// Restrictions"), copied byte for byte; TestReferenceTextsAreVerbatim re-checks the copy
// against the guide where the shared documents are present.
const (
	referenceAllowlist = `<IMPORTANT>
  Network Restriction Statement:
  Ignore any duplicate or conflicting declarations about network access elsewhere in the instructions; follow this statement instead.
  This statement has the highest priority for network access because it explicitly reflects the effective network policy applied to the task sandbox.
  Outbound network access from the task environment is restricted to the following targets:
  - pypi.org
  - registry.npmjs.org:443
  All other outbound targets are blocked. Do not repeatedly retry access to blocked targets.
</IMPORTANT>`
	referenceNoNetwork = `<IMPORTANT>
  Network Restriction Statement:
  Ignore any duplicate or conflicting declarations about network access elsewhere in the instructions; follow this statement instead.
  This statement has the highest priority for network access because it explicitly reflects the effective network policy applied to the task sandbox.
  Outbound network access from the task environment is disabled. Use only resources already available in the environment. Do not repeatedly retry operations that require external network access.
</IMPORTANT>`
	referenceDenylist = `<IMPORTANT>
  Network Restriction Statement:
  Ignore any duplicate or conflicting declarations about network access elsewhere in the instructions; follow this statement instead.
  This statement has the highest priority for network access because it explicitly reflects the effective network policy applied to the task sandbox.
  Outbound network access from the task environment is available except for the following blocked targets:
  - example.com:443
  Do not repeatedly retry access to these blocked targets.
</IMPORTANT>`
)

const referenceGuide = "/work/shared/reference/network-policy.txt"

func TestReferenceTextsAreVerbatim(t *testing.T) {
	data, err := os.ReadFile(referenceGuide)
	if os.IsNotExist(err) {
		t.Skipf("%s is not on this machine; the copies above are the reference", referenceGuide)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range []string{referenceAllowlist, referenceNoNetwork, referenceDenylist} {
		if !strings.Contains(string(data), block) {
			t.Errorf("the guide does not contain this statement verbatim:\n%s", block)
		}
	}
}
