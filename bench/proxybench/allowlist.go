package proxybench

import (
	"encoding/json"
	"fmt"
)

// LargeAllowlist builds an allowlist policy of n entries: n-1 rules that match nothing
// the benchmark dials (host names, leading wildcards, IPv4 and IPv6 CIDRs and addresses,
// some with ports, all under .test or in ranges the benchmark never uses), and, last,
// allow (the rule that admits the upstream), so that a matcher that scans the list in
// order pays for every entry.
func LargeAllowlist(n int, allow string) ([]byte, error) {
	if n < 1 {
		return nil, fmt.Errorf("proxybench: allowlist of %d entries", n)
	}
	hosts := make([]string, 0, n)
	for i := 0; len(hosts) < n-1; i++ {
		// Six kinds in turn; j numbers the entries of one kind, so no entry repeats.
		j := i / 6
		a, b := (j>>8)&0xff, j&0xff
		var h string
		switch i % 6 {
		case 0:
			h = fmt.Sprintf("svc%d.example%d.test", i, i%97)
		case 1:
			h = fmt.Sprintf("*.tenant%d.bench.test", i)
		case 2:
			h = fmt.Sprintf("10.%d.%d.0/24", a, b)
		case 3:
			h = fmt.Sprintf("api%d.bench.test:443", i)
		case 4:
			h = fmt.Sprintf("198.18.%d.%d", a, b)
		case 5:
			h = fmt.Sprintf("fd00:%x:%x::/48", a, b)
		}
		hosts = append(hosts, h)
	}
	hosts = append(hosts, allow)
	return json.Marshal(map[string]any{"network_mode": "allowlist", "allowed_hosts": hosts})
}
