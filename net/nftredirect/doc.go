// Package nftredirect owns the nftables table, in a sidecar's network
// namespace, that turns the agent's point-to-point link into a transparent
// path through the sidecar.
//
// For packets that arrive on the link (Spec.Interface) the table:
//   - drops any packet whose source is not the agent's end (class spoofed) and
//     any packet that is not IPv4 (class other: the link carries IPv4 only);
//   - sends TCP and UDP to port 53 of any address to Spec.DNS (DNAT);
//   - redirects every other TCP connection, to any address that is not the
//     sidecar's own (fib daddr type local), to Spec.TCPPort, where the listener
//     reads the original destination with package origdst;
//   - drops other UDP (class udp), ICMP (class icmp) and every other protocol
//     (class other), counting packets and bytes per class in named counters.
//
// Drops happen in a raw-priority prerouting chain, before conntrack, so a flood
// of refused packets does not fill the conntrack table. The sidecar keeps
// forwarding off, so a packet a missing rule lets through is still not routed
// anywhere: the table decides what reaches the sidecar, never what leaves it.
//
// The package touches only its own table (Spec.Table): Docker's NAT rules and
// anybody else's tables in the namespace are left alone. Every call takes the
// namespace as a file descriptor (nftables.WithNetNSFd): the library opens its
// netlink socket on a locked goroutine of its own, which moves back or lets the
// thread die, so none of the caller's threads changes namespace. Check's
// forwarding read goes through package nssysctl, on a discarded thread.
package nftredirect
