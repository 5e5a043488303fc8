package netnstest

import "testing"

func TestLeftoverPID(t *testing.T) {
	tests := []struct {
		name, label string
		pid         int
		ok          bool
	}{
		{"cetest-link-123-4", "link", 123, true},
		{"cetest-link-123-4", "nft", 0, false},
		{"cetest-linkx-123-4", "link", 0, false},
		{"cetest-link-abc-4", "link", 0, false},
		{"cetest-link-123", "link", 0, false},
		{"cetest-link-0-1", "link", 0, false},
		{"other", "link", 0, false},
	}
	for _, tt := range tests {
		pid, ok := leftoverPID(tt.name, tt.label)
		if pid != tt.pid || ok != tt.ok {
			t.Errorf("leftoverPID(%q, %q) = %d, %v; want %d, %v", tt.name, tt.label, pid, ok, tt.pid, tt.ok)
		}
	}
}
