package procnet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ForwardingOn names the first file that says a packet would be forwarded: IPv4's
// switch, IPv6's (absent when the kernel has no IPv6), and each IPv4 interface's.
func TestForwardingOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string // the reason, or its start
	}{
		{"all off", map[string]string{"sys/net/ipv4/ip_forward": "0\n", "sys/net/ipv6/conf/all/forwarding": "0\n",
			"sys/net/ipv4/conf/eth0/forwarding": "0\n"}, ""},
		{"no IPv6", map[string]string{"sys/net/ipv4/ip_forward": "0\n"}, ""},
		{"IPv4 on", map[string]string{"sys/net/ipv4/ip_forward": "1\n"}, "sys/net/ipv4/ip_forward is 1 (want 0)"},
		{"IPv6 on", map[string]string{"sys/net/ipv4/ip_forward": "0\n", "sys/net/ipv6/conf/all/forwarding": "1\n"},
			"sys/net/ipv6/conf/all/forwarding is 1 (want 0)"},
		{"one interface on", map[string]string{"sys/net/ipv4/ip_forward": "0\n", "sys/net/ipv4/conf/eth1/forwarding": "1\n"},
			"sys/net/ipv4/conf/eth1/forwarding is 1 (want 0)"},
		// Unreadable: not ready, saying which file could not be read (and why).
		{"no IPv4 file", map[string]string{}, "cannot read sys/net/ipv4/ip_forward: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			for path, v := range tc.files {
				file := filepath.Join(proc, path)
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := ForwardingOn(proc); !strings.HasPrefix(got, tc.want) || tc.want == "" && got != "" {
				t.Fatalf("ForwardingOn: %q, want %q", got, tc.want)
			}
		})
	}
}
