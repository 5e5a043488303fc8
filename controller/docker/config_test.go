package docker

import (
	"strings"
	"testing"
)

// A resolver the sidecar would refuse fails New, naming the value and the rule, rather
// than every sidecar later started with it.
func TestConfigDNSUpstreams(t *testing.T) {
	for _, tc := range []struct {
		upstream string
		want     string // "" if accepted
	}{
		{"10.0.0.2", ""},
		{"10.0.0.2:5353", ""},
		{"[fd00::2]:53", ""},
		{"fd00::2", ""},
		{"resolver.test:53", `docker: dns upstream "resolver.test:53": want an IP address with an optional port`},
		{"10.0.0.2:0", `docker: dns upstream "10.0.0.2:0": port 0`},
		{"", `docker: dns upstream "": want an IP address`},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			_, err := New(nil, Config{StateDir: t.TempDir(), DNSUpstreams: []string{"10.0.0.1", tc.upstream}}, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("error %v, want it to start %q", err, tc.want)
			}
		})
	}
}
