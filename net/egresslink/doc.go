// Package egresslink ensures, checks and removes an agent's whole transparent
// path through its sidecar as one thing: the nftables table in the sidecar's
// namespace (package nftredirect) and the veth pair that makes the sidecar the
// agent's only way out (package vethlink).
//
// Order is what keeps it fail closed and observable: Ensure writes the table
// before the link, so the drop counters exist before the agent's default route
// via the sidecar appears; Remove deletes the link (and with it that route)
// before the table. Namespaces are taken by pid (/proc/<pid>/ns/net) and the
// controller's own namespace is refused, so a stale or reused pid never has
// the host's routes or firewall edited.
package egresslink
