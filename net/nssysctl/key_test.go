package nssysctl

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestPath(t *testing.T) {
	tests := []struct {
		key, want string
		wantErr   bool
	}{
		{key: "net/ipv4/ip_forward", want: "/proc/sys/net/ipv4/ip_forward"},
		{key: "net/ipv6/conf/eth0.100/disable_ipv6", want: "/proc/sys/net/ipv6/conf/eth0.100/disable_ipv6"},
		{key: "kernel/panic", wantErr: true},
		{key: "net", wantErr: true},
		{key: "", wantErr: true},
		{key: "net//ip_forward", wantErr: true},
		{key: "net/../kernel/panic", wantErr: true},
		{key: "net/ipv4/./ip_forward", wantErr: true},
		{key: "/net/ipv4/ip_forward", wantErr: true},
		{key: "net/ipv4/ip_forward/", wantErr: true},
		{key: "net/ipv4\x00/x", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, err := Path(tt.key)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("Path(%q) = %q, %v; want %q, error %v", tt.key, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// FuzzPath checks that no accepted key names a file outside /proc/sys/net.
func FuzzPath(f *testing.F) {
	for _, s := range []string{"net/ipv4/ip_forward", "net/../x", "kernel/x", "net/a/../../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		p, err := Path(key)
		if err != nil {
			return
		}
		if clean := filepath.Clean(p); clean != p || !strings.HasPrefix(clean, "/proc/sys/net/") {
			t.Fatalf("Path(%q) = %q, which is not a clean path under /proc/sys/net/", key, p)
		}
	})
}
