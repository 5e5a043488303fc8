package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/compass-egress/compass-egress/controller/verifyplan"
	"github.com/compass-egress/compass-egress/images/probe/probespec"
	"github.com/compass-egress/compass-egress/policy"
)

// VerifyOptions are the targets of an adversarial check (see verifyplan.Targets).
type VerifyOptions = verifyplan.Targets

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

func (e *Env) planChecks(pol policy.Policy, o VerifyOptions) ([]verifyplan.Check, error) {
	return verifyplan.Plan(pol, verifyplan.Addrs{Sidecar: e.plan.Sidecar, Gateway: e.plan.Gateway}, o)
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
	planned, err := e.planChecks(in.Policy, o)
	if err != nil {
		return VerifyReport{}, err
	}
	checks := make([]probespec.Check, len(planned))
	for i, p := range planned {
		checks[i] = p.Check
	}
	restricted := in.Policy.Restricted()
	var before uint64
	var beforeErr error
	if restricted {
		before, beforeErr = e.udpDrops(ctx)
	}
	results, err := e.runProbe(ctx, checks)
	if err != nil {
		return VerifyReport{}, err
	}
	rep := VerifyReport{Env: e.names.Env, Mode: in.Policy.Mode, Digest: in.Digest, OK: true}
	for i, p := range planned {
		got := results[p.Name]
		row := VerifyRow{Check: p.Label, Target: p.Target, Expected: p.Want, Observed: p.Observed(got), Detail: got.Detail}
		if got.Name == "" {
			row.Observed, row.Detail = "no result", "the probe reported nothing for check "+planned[i].Name
		}
		row.OK = row.Expected == row.Observed
		rep.OK = rep.OK && row.OK
		rep.Rows = append(rep.Rows, row)
	}
	if restricted {
		after, err := e.udpDrops(ctx)
		row := VerifyRow{Target: e.link.String()}
		row.Check, row.Expected, row.Observed, row.Detail = verifyplan.DropRow(before, after, errors.Join(beforeErr, err))
		row.OK = row.Expected == row.Observed
		rep.OK = rep.OK && row.OK
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

// udpDrops reads the UDP drop counter of the sidecar's transparent table.
func (e *Env) udpDrops(ctx context.Context) (uint64, error) {
	pid, err := e.sidecarPID(ctx)
	if err != nil {
		return 0, err
	}
	d, err := e.p.link.Counters(pid, e.link)
	if err != nil {
		return 0, fmt.Errorf("transparent path %s: %w", e.link, err)
	}
	return d["udp"].Packets, nil
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
