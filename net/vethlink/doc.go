// Package vethlink wires an agent's network namespace to its sidecar's with a
// point-to-point veth pair and makes that link the agent's only IPv4 way out.
//
// The pair is created in one netlink request with each end already in its
// namespace, so no end ever appears in the host's namespace, and no Docker
// bridge or host firewall rule is on the path. The agent's end gets the IPv4
// default route via the sidecar's end (Docker's is replaced); every other IPv4
// default route and every IPv6 default route in the agent is deleted.
//
// The link carries IPv4 only: both ends have IPv6 address generation off, so
// neither has a link-local address and the agent's IPv6 connects fail at once
// with "network unreachable" (clients fall back to IPv4, where the sidecar
// decides). The sidecar's table (package nftredirect) drops any IPv6 that
// arrives anyway.
//
// Every call takes both namespaces as handles and works through netlink
// handles bound to them. netlink.NewHandleAt switches its thread into the
// namespace while it opens the socket; it runs on a thread of its own that is
// discarded afterwards (nsthread.Discarded), so no thread of the caller's ever
// changes namespace.
package vethlink
