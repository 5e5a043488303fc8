package harness

import "testing"

// Only a run's own egress network is taken over from the stuck leftovers: never a
// network a test made, nor another package's.
func TestIsEgressNetworkName(t *testing.T) {
	h := &Harness{Owner: "e2e-dockerenv"}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"ce2e-dockerenv-16612-egress", true},
		{"ce2e-dockerenv-7-egress", true},
		{"ce2e-e2e-16612-egress", false},           // another package's
		{"ce2e-dockerenv-16612-icc-egress", false}, // a test's (h.Name("icc-egress"))
		{"compass-net-ce2e-dockerenv-16612-egress", false},
		{"ce2e-dockerenv-16612-egress-x", false},
		{"ce2e-dockerenv--egress", false},
		{"ce2e-dockerenv-16612", false},
	} {
		if got := h.isEgressNetworkName(tc.name); got != tc.want {
			t.Errorf("isEgressNetworkName(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
