package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/controller/verifyplan"
)

func newEnvVerifyCommand(f *envFlags) *cobra.Command {
	var (
		t                taskFlags
		outside          string
		outsidePort      uint16
		allowed, blocked []string
		allowedTCP       []string
		blockedTCP       []string
		banner           string
	)
	cmd := &cobra.Command{
		Use:   "verify --task ID [--allowed HOST:PORT]... [--blocked HOST:PORT]... [--allowed-tcp HOST:PORT]... [--blocked-tcp HOST:PORT]...",
		Short: "Adversarial check from inside the agent's network namespace; exit 1 on any unexpected outcome",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			role, err := t.parse()
			if err != nil {
				return err
			}
			for _, fl := range []struct {
				name    string
				targets []string
			}{{"allowed", allowed}, {"blocked", blocked}, {"allowed-tcp", allowedTCP}, {"blocked-tcp", blockedTCP}} {
				for _, t := range fl.targets {
					if err := checkHostPort(t); err != nil {
						return usageError{fmt.Errorf("--%s %q: %w", fl.name, t, err)}
					}
				}
			}
			if outsidePort == 0 {
				// Verify reads 0 as its default, 80: a check of another port than asked.
				return usageError{errors.New(`--outside-port "0": the port is not an integer in 1..65535`)}
			}
			if banner == "" {
				return usageError{errors.New(`--tcp-banner "": want the first bytes the --allowed-tcp/--blocked-tcp servers send`)}
			}
			opts := docker.VerifyOptions{Allowed: allowed, Blocked: blocked, AllowedTCP: allowedTCP, BlockedTCP: blockedTCP,
				Banner: banner, OutsidePort: outsidePort}
			if outside != "" {
				a, err := netip.ParseAddr(outside)
				if err != nil {
					return usageError{fmt.Errorf("--outside: %w", err)}
				}
				opts.Outside = a
			}
			e, done, err := f.lookup(cmd.Context(), t, role)
			if err != nil {
				return err
			}
			defer done()
			rep, err := e.Verify(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := f.print(cmd.OutOrStdout(), rep, func(w io.Writer) { verifyText(w, rep) }); err != nil {
				return err
			}
			if !rep.OK {
				return errFailed
			}
			return nil
		},
	}
	t.bind(cmd)
	cmd.Flags().StringArrayVar(&allowed, "allowed", nil, "HOST:PORT that must work through the proxy (repeatable)")
	cmd.Flags().StringArrayVar(&blocked, "blocked", nil, "HOST:PORT that must fail through the proxy (repeatable)")
	cmd.Flags().StringArrayVar(&allowedTCP, "allowed-tcp", nil, "HOST:PORT of a server that speaks first (SSH...), allowed by name: resolved through the sidecar, then reached without the proxy (repeatable)")
	cmd.Flags().StringArrayVar(&blockedTCP, "blocked-tcp", nil, "HOST:PORT of a server that speaks first, which the policy refuses (repeatable)")
	cmd.Flags().StringVar(&banner, "tcp-banner", verifyplan.DefaultBanner, "the first bytes the --allowed-tcp and --blocked-tcp servers send")
	cmd.Flags().StringVar(&outside, "outside", "", "an address outside the sandbox for the direct checks (default: the egress network's gateway)")
	cmd.Flags().Uint16Var(&outsidePort, "outside-port", 80, "TCP port of the direct check")
	return cmd
}

// checkHostPort checks a verify target: a check of port 0 or 70000 would only report a
// mismatch, read as a policy that does not hold.
func checkHostPort(t string) error {
	host, port, err := net.SplitHostPort(t)
	if err != nil {
		return errors.New("want HOST:PORT ([v6]:PORT for an IPv6 address)")
	}
	if host == "" {
		return errors.New("the host is empty")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("the port %q is not an integer in 1..65535", port)
	}
	return nil
}

func verifyText(w io.Writer, rep docker.VerifyReport) {
	fmt.Fprintf(w, "verify %s under %s (%s)\n", rep.Env, rep.Mode, rep.Digest)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tTARGET\tEXPECTED\tOBSERVED\t\tDETAIL")
	for _, r := range rep.Rows {
		mark := "ok"
		if !r.OK {
			mark = "MISMATCH"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Check, r.Target, r.Expected, r.Observed, mark, r.Detail)
	}
	tw.Flush()
	if rep.OK {
		fmt.Fprintln(w, "OK: every outcome as expected")
	} else {
		fmt.Fprintln(w, "FAILED: some outcomes differ from the policy")
	}
}
