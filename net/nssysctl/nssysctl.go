// Package nssysctl reads and writes the network sysctls of one network
// namespace from outside it.
//
// Files under /proc/sys/net resolve to the namespace of the thread that opens
// them, so each call opens its file on a thread that has entered the namespace
// (package nsthread). Only keys under net/ are accepted: every other sysctl is
// global to the host, and a per-namespace helper must never change one.
package nssysctl

import (
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/net/nsthread"
)

// Get returns the value of key (e.g. "net/ipv4/ip_forward") in ns, without
// the trailing newline.
func Get(ns netns.NsHandle, key string) (string, error) {
	path, err := Path(key)
	if err != nil {
		return "", err
	}
	var value string
	err = nsthread.Run(ns, func() error {
		b, err := os.ReadFile(path)
		value = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("nssysctl: read %s in namespace %s: %w", key, ns, err)
	}
	return value, nil
}

// Set writes value to key in ns.
func Set(ns netns.NsHandle, key, value string) error {
	path, err := Path(key)
	if err != nil {
		return err
	}
	err = nsthread.Run(ns, func() error {
		return os.WriteFile(path, []byte(value), 0)
	})
	if err != nil {
		return fmt.Errorf("nssysctl: write %s=%q in namespace %s: %w", key, value, ns, err)
	}
	return nil
}
