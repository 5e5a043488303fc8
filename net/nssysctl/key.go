package nssysctl

import (
	"fmt"
	"strings"
)

// Path checks key and returns its file under /proc/sys. A key is a
// slash-separated path that starts with "net/"; slashes (not dots) separate
// its parts so that interface names with dots (eth0.100) stay unambiguous.
func Path(key string) (string, error) {
	parts := strings.Split(key, "/")
	if len(parts) < 2 || parts[0] != "net" {
		return "", fmt.Errorf("nssysctl: key %q: must be a path under net/ (only network sysctls are per namespace)", key)
	}
	for i, p := range parts {
		if p == "" || p == "." || p == ".." || strings.ContainsRune(p, 0) {
			return "", fmt.Errorf("nssysctl: key %q: part %d (%q) is empty, a dot path or holds NUL", key, i, p)
		}
	}
	return "/proc/sys/" + key, nil
}
