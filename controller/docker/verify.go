package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/compass-egress/compass-egress/images/probe/probespec"
	"github.com/compass-egress/compass-egress/policy"
)

// VerifyOptions are the targets of an adversarial check.
type VerifyOptions struct {
	Allowed []string // host:port that must work through the proxy
	Blocked []string // host:port that must fail through the proxy (and not resolve)
	// Outside is an address outside the sandbox for the direct checks (TCP to it, DNS
	// to port 53 over UDP and TCP); default: the egress network's gateway (the host).
	Outside netip.Addr
	// OutsidePort is the TCP port of the direct check; default 80.
	OutsidePort uint16
}

// VerifyRow is one line of the verify table.
type VerifyRow struct {
	Check    string `json:"check"`
	Target   string `json:"target"`
	Expected string `json:"expected"`
	Observed string `json:"observed"`
	Detail   string `json:"detail"`
	OK       bool   `json:"ok"`
}

// VerifyReport is the verify table and its verdict.
type VerifyReport struct {
	Env    string      `json:"env"`
	Mode   policy.Mode `json:"mode"`
	Digest string      `json:"digest"`
	Rows   []VerifyRow `json:"rows"`
	OK     bool        `json:"ok"`
}

const (
	works = "works"
	fails = "fails"
)

// plannedCheck is one probe check and the outcome the mode calls for.
type plannedCheck struct {
	probespec.Check
	label, target string
	wantWorks     bool
	resolved      bool // judge by "resolved" instead of "reachable"
}

func (e *Env) planChecks(mode policy.Mode, o VerifyOptions) ([]plannedCheck, error) {
	proxy := netip.AddrPortFrom(e.plan.Sidecar, proxyPort).String()
	resolver := netip.AddrPortFrom(e.plan.Sidecar, dnsPort).String()
	public := mode == policy.ModePublic
	var out []plannedCheck
	add := func(label, target string, want bool, c probespec.Check) {
		c.Name = strconv.Itoa(len(out))
		out = append(out, plannedCheck{Check: c, label: label, target: target, wantWorks: want})
	}
	for _, t := range o.Allowed {
		if _, _, err := net.SplitHostPort(t); err != nil {
			return nil, fmt.Errorf("verify: allowed target %q: want host:port", t)
		}
		add("allowed via proxy", t, true, probespec.Check{Kind: "proxy", Target: t, Proxy: proxy})
	}
	for _, t := range o.Blocked {
		host, _, err := net.SplitHostPort(t)
		if err != nil {
			return nil, fmt.Errorf("verify: blocked target %q: want host:port", t)
		}
		add("blocked via proxy", t, false, probespec.Check{Kind: "proxy", Target: t, Proxy: proxy})
		if _, err := netip.ParseAddr(host); err != nil {
			add("DNS of blocked name", host, false, probespec.Check{Kind: "dns", Server: resolver, QName: host})
			out[len(out)-1].resolved = true
		}
	}
	outside := netip.AddrPortFrom(o.Outside, o.OutsidePort).String()
	outsideDNS := netip.AddrPortFrom(o.Outside, dnsPort).String()
	add("direct TCP out", outside, public, probespec.Check{Kind: "tcp", Target: outside})
	add("UDP out (DNS query)", outsideDNS, public, probespec.Check{Kind: "dns", Server: outsideDNS, QName: "compass-verify.test"})
	add("DNS to outside resolver (TCP)", outsideDNS, public, probespec.Check{Kind: "dns", Net: "tcp", Server: outsideDNS, QName: "compass-verify.test"})
	// The task network's gateway address must be on no host interface in any mode (see
	// taskNetworkOptions): a refusal counts as reachable, so any port shows it is there.
	gw := netip.AddrPortFrom(e.plan.Gateway, o.OutsidePort).String()
	gwDNS := netip.AddrPortFrom(e.plan.Gateway, dnsPort).String()
	add("host at task network gateway (TCP)", gw, false, probespec.Check{Kind: "tcp", Target: gw})
	add("host at task network gateway (UDP, DNS query)", gwDNS, false, probespec.Check{Kind: "dns", Server: gwDNS, QName: "compass-verify.test"})
	for _, port := range []uint16{proxyPort, 9090, 80} {
		t := netip.AddrPortFrom(e.plan.Sidecar, port).String()
		add("sidecar admin API", t, false, probespec.Check{Kind: "admin", Target: t})
	}
	return out, nil
}

// Verify runs the probe in a throwaway container sharing the agent's network
// namespace (the agent's filesystem is not touched) and compares what it observes with
// what the intended mode calls for.
func (e *Env) Verify(ctx context.Context, o VerifyOptions) (VerifyReport, error) {
	in, ok, err := e.dir.readIntent()
	if err != nil {
		return VerifyReport{}, err
	}
	if !ok {
		return VerifyReport{}, fmt.Errorf("verify: %s has no intended policy", e.names.Env)
	}
	if !o.Outside.IsValid() {
		if o.Outside, err = e.egressGateway(ctx); err != nil {
			return VerifyReport{}, err
		}
	}
	if o.OutsidePort == 0 {
		o.OutsidePort = 80
	}
	planned, err := e.planChecks(in.Policy.Mode, o)
	if err != nil {
		return VerifyReport{}, err
	}
	checks := make([]probespec.Check, len(planned))
	for i, p := range planned {
		checks[i] = p.Check
	}
	results, err := e.runProbe(ctx, checks)
	if err != nil {
		return VerifyReport{}, err
	}
	rep := VerifyReport{Env: e.names.Env, Mode: in.Policy.Mode, Digest: in.Digest, OK: true}
	for i, p := range planned {
		got := results[p.Name]
		observedWorks := got.Reachable
		if p.resolved {
			observedWorks = got.Resolved
		}
		row := VerifyRow{Check: p.label, Target: p.target, Expected: outcome(p.wantWorks), Observed: outcome(observedWorks), Detail: got.Detail}
		if got.Name == "" {
			row.Observed, row.Detail = "no result", "the probe reported nothing for check "+planned[i].Name
		}
		row.OK = row.Expected == row.Observed
		rep.OK = rep.OK && row.OK
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

func outcome(ok bool) string {
	if ok {
		return works
	}
	return fails
}

func (e *Env) runProbe(ctx context.Context, checks []probespec.Check) (map[string]probespec.Result, error) {
	spec, err := json.Marshal(checks)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	agent, err := e.p.api.ContainerInspect(ctx, e.agentRef)
	if err != nil {
		return nil, fmt.Errorf("verify: inspect agent: %w", err)
	}
	labels := e.p.labels(e.names, e.task, e.role, roleProbe)
	name := fmt.Sprintf("compass-probe-%s-%d", e.names.Env, time.Now().UnixNano())
	created, err := e.p.api.ContainerCreate(ctx,
		&container.Config{Image: e.p.cfg.ProbeImage, Cmd: []string{"check", string(spec)}, Labels: labels},
		&container.HostConfig{NetworkMode: container.NetworkMode("container:" + agent.ID)},
		nil, nil, name)
	if err != nil {
		return nil, fmt.Errorf("verify: create probe (image %s): %w", e.p.cfg.ProbeImage, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = e.p.api.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true})
	}()
	if err := e.p.api.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return nil, fmt.Errorf("verify: start probe: %w", err)
	}
	waitC, errC := e.p.api.ContainerWait(ctx, created.ID, container.WaitConditionNotRunning)
	select {
	case <-waitC:
	case err := <-errC:
		return nil, fmt.Errorf("verify: wait for probe: %w", err)
	}
	rc, err := e.p.api.ContainerLogs(ctx, created.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return nil, fmt.Errorf("verify: probe output: %w", err)
	}
	defer rc.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, rc); err != nil {
		return nil, fmt.Errorf("verify: probe output: %w", err)
	}
	var results []probespec.Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		return nil, fmt.Errorf("verify: probe output %q: %w (stderr: %s)", strings.TrimSpace(stdout.String()), err, strings.TrimSpace(stderr.String()))
	}
	byName := make(map[string]probespec.Result, len(results))
	for _, r := range results {
		byName[r.Name] = r
	}
	return byName, nil
}
