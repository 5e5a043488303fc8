package procnet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ForwardingOn says why forwarding is on, or "" when IPv4 and IPv6 forwarding are off,
// as read below procRoot. A missing IPv6 file means the kernel has no IPv6 here, so nothing to forward.
func ForwardingOn(procRoot string) string {
	for _, f := range []struct {
		path     string
		optional bool
	}{{"sys/net/ipv4/ip_forward", false}, {"sys/net/ipv6/conf/all/forwarding", true}} {
		data, err := os.ReadFile(filepath.Join(procRoot, f.path))
		if err != nil {
			if f.optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return fmt.Sprintf("cannot read %s: %v", f.path, err)
		}
		if v := strings.TrimSpace(string(data)); v != "0" {
			return fmt.Sprintf("%s is %s (want 0)", f.path, v)
		}
	}
	// IPv4 forwards a packet by the forwarding of the interface it came in on (conf/all
	// is ip_forward); conf/default is what an interface attached later starts with.
	ifaces, _ := filepath.Glob(filepath.Join(procRoot, "sys/net/ipv4/conf/*/forwarding"))
	for _, file := range ifaces {
		rel, _ := filepath.Rel(procRoot, file)
		data, err := os.ReadFile(file)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // the interface went away
				continue
			}
			return fmt.Sprintf("cannot read %s: %v", rel, err)
		}
		if v := strings.TrimSpace(string(data)); v != "0" {
			return fmt.Sprintf("%s is %s (want 0)", rel, v)
		}
	}
	return ""
}
