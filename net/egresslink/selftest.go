package egresslink

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nssysctl"
	"github.com/compass-egress/compass-egress/net/nsthread"
)

// SelfTest builds the whole path (slot 0) between two throw-away namespaces,
// checks it and removes it: it fails when the kernel lacks what the path needs
// (veth, nf_tables with fib, nat and named counters) or the caller may not
// create namespaces. The namespaces are unnamed and go with their handles.
func SelfTest() error {
	var p Pair
	err := nsthread.Discarded(func() (err error) {
		// Discarded: netns.New moves this thread into each new namespace.
		if p.Agent, err = netns.New(); err != nil {
			return err
		}
		p.Sidecar, err = netns.New()
		return err
	})
	defer p.Close()
	if err != nil {
		return fmt.Errorf("egresslink: create a throw-away namespace: %w", err)
	}
	// A new namespace may start forwarding; a sidecar never does, and Check says so.
	for _, key := range []string{"net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		if err := nssysctl.Set(p.Sidecar, key, "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	s, err := ForSlot(0, netip.MustParseAddr("192.0.2.2"), netip.MustParseAddrPort("169.254.1.2:53"), 15001)
	if err != nil {
		return err
	}
	if err := Ensure(p, s); err != nil {
		return err
	}
	problems, err := Check(p, s)
	if err == nil && len(problems) > 0 {
		err = fmt.Errorf("egresslink: path not as written: %v", problems)
	}
	return errors.Join(err, Remove(p, s))
}
