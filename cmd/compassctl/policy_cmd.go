package main

import (
	"fmt"
	"io"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/net/addrguard"
	"github.com/compass-egress/compass-egress/policy"
)

func init() { subcommands = append(subcommands, newPolicyCommand) }

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Check a policy, or ask what it decides for a destination",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newPolicyCheckCommand(), newPolicyMatchCommand())
	return cmd
}

func newPolicyCheckCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "check POLICY_JSON",
		Short: "Validate a policy and print its canonical form",
		Args:  exactArgs("POLICY_JSON"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := policy.Parse([]byte(args[0]))
			if err != nil {
				return usageError{prefixed("policy: ", err)}
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), p)
			return err
		},
	}
}

func newPolicyMatchCommand() *cobra.Command {
	var resolve string
	var denyPrivate bool
	cmd := &cobra.Command{
		Use:   "match POLICY_JSON HOST[:PORT] [--resolve IP] [--deny-private]",
		Short: "Print allow or deny for a destination, with the rule and the reason (port 443 by default)",
		Long: `Print what the policy decides for a connection to HOST[:PORT]: "allow" or "deny",
the rule that decided ("-" when none matched) and the reason. Host rules match the name;
IP and CIDR rules match the address dialled, which --resolve gives for a name. An
internal address (loopback, link-local, unspecified, multicast, IPv4-mapped or
-embedding) is denied unless an IP or CIDR rule allows it, with the proxy's own guard;
--deny-private adds the private-use ranges, as for a sidecar run with that flag.
Exits 0 whatever the decision.`,
		Args: exactArgs("POLICY_JSON", "HOST[:PORT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseEmpty(cmd.Flags(), "resolve"); err != nil {
				return err
			}
			p, err := policy.Parse([]byte(args[0]))
			if err != nil {
				return usageError{prefixed("policy: ", err)}
			}
			name, addr, port, err := parseDestination(args[1], resolve)
			if err != nil {
				return usageError{err}
			}
			guard := addrguard.New(addrguard.Config{DenyPrivate: denyPrivate})
			return writeMatch(cmd.OutOrStdout(), policy.Compile(p), guard, name, addr, port)
		},
	}
	cmd.Flags().StringVar(&resolve, "resolve", "", "the address the host name would be dialled at")
	cmd.Flags().BoolVar(&denyPrivate, "deny-private", false, "guard the private-use ranges too, as a sidecar run with compass-proxy --deny-private does")
	return cmd
}

// parseDestination reads HOST[:PORT] (a name or an address; [v6]:port for IPv6 with a
// port) and the optional --resolve address of a name.
func parseDestination(dest, resolve string) (string, netip.Addr, uint16, error) {
	t, err := policy.ParseTarget(dest)
	if err != nil {
		return "", netip.Addr{}, 0, fmt.Errorf("destination %q: %w", dest, err)
	}
	port := t.Port
	if port == 0 {
		port = 443
	}
	switch t.Kind {
	case policy.KindAddr:
		if resolve != "" {
			return "", netip.Addr{}, 0, fmt.Errorf("--resolve is for a host name; %q is already an address", dest)
		}
		return "", t.Prefix.Addr(), port, nil
	case policy.KindHost:
		var addr netip.Addr
		if resolve != "" {
			a, err := netip.ParseAddr(resolve)
			if err != nil || a.Zone() != "" {
				return "", netip.Addr{}, 0, fmt.Errorf("--resolve %q: not an IP address", resolve)
			}
			addr = a
		}
		return t.Host, addr, port, nil
	}
	return "", netip.Addr{}, 0, fmt.Errorf("destination %q: a destination is one host name or address, not a wildcard or a range", dest)
}

// writeMatch prints m's decision for the destination, then guard's: the proxy's own
// guard, without operator exemptions or the sidecar's own addresses and gateways, which
// only a running sidecar knows.
func writeMatch(w io.Writer, m *policy.Matcher, guard *addrguard.Guard, name string, addr netip.Addr, port uint16) error {
	// The proxy matches and guards IPv4-mapped addresses as the IPv4 address they dial.
	addr = addr.Unmap()
	d := m.Decide(name, addr, port)
	verdict, rule, reason := "deny", "-", string(d.Reason)
	if d.Allowed {
		verdict = "allow"
	}
	if d.Rule.Kind != 0 {
		rule = d.Rule.String()
	}
	if d.Allowed && addr.IsValid() {
		if guard.Refuses(m, addr, port) {
			verdict, rule, reason = "deny", "-", string(policy.ReasonInternalAddress)
		}
	}
	_, err := fmt.Fprintf(w, "%s rule=%s reason=%s\n", verdict, rule, reason)
	return err
}
