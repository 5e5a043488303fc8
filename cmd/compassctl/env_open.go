package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// openResult is what open and attach print.
type openResult struct {
	Env       string        `json:"env"`
	Task      string        `json:"task"`
	Agent     string        `json:"agent"`
	Sidecar   string        `json:"sidecar"`
	Network   string        `json:"network"`
	SidecarIP string        `json:"sidecar_ip"`
	Duration  time.Duration `json:"duration_ns"`
}

func (r openResult) text(w io.Writer) {
	fmt.Fprintf(w, "environment %s open in %s\n", r.Env, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "  agent    %s\n  sidecar  %s (%s)\n  network  %s\n", r.Agent, r.Sidecar, r.SidecarIP, r.Network)
}

// policySource is the --policy / --phase --plan pair shared by open and switch.
type policySource struct {
	policy, phase, plan string
	cmd                 *cobra.Command
}

func (s *policySource) bind(cmd *cobra.Command, phaseHelp string) {
	s.cmd = cmd
	cmd.Flags().StringVar(&s.policy, "policy", "", `policy in the shared wire format, e.g. '"no-network"' or '{"network_mode":"allowlist","allowed_hosts":["pypi.org"]}'`)
	cmd.Flags().StringVar(&s.plan, "plan", "", "plan file to take the phase's policy from")
	cmd.Flags().StringVar(&s.phase, "phase", "", phaseHelp)
}

// checkGiven refuses --policy or --plan given empty (an unset shell variable): read as
// absent, open and attach would start under the runtime default, public.
func (s *policySource) checkGiven() error {
	if s.cmd.Flags().Changed("policy") && s.policy == "" {
		return usageError{fmt.Errorf(`--policy "": is empty; give a policy ('"public"' for no restriction)`)}
	}
	if s.cmd.Flags().Changed("plan") && s.plan == "" {
		return usageError{fmt.Errorf(`--plan "": is empty; give a plan file`)}
	}
	return nil
}

// resolve returns the policy and the phase label. def is the phase used with --plan
// when --phase is absent; task picks the task's plan out of a multi-task plan file.
func (s *policySource) resolve(task, def string) (policy.Policy, string, error) {
	if err := s.checkGiven(); err != nil {
		return policy.Policy{}, "", err
	}
	switch {
	case s.policy != "" && s.plan != "":
		return policy.Policy{}, "", usageError{fmt.Errorf("give --policy or --plan, not both")}
	case s.policy == "" && s.plan == "" && s.phase != "":
		// Dropped, it would leave the runtime default (public) in force.
		return policy.Policy{}, "", usageError{fmt.Errorf("--phase %q needs --plan FILE to take the policy from", s.phase)}
	case s.policy != "" && s.phase != "":
		// open and attach dropped it; switch took it as the label, which --label-phase is.
		return policy.Policy{}, "", usageError{fmt.Errorf("--phase %q picks a phase of --plan; with --policy, --phase is not used (switch: --label-phase names the phase)", s.phase)}
	case s.policy != "":
		p, err := policy.Parse([]byte(s.policy))
		if err != nil {
			return policy.Policy{}, "", usageError{fmt.Errorf("--policy: %w", err)}
		}
		return p, def, nil
	case s.plan != "":
		phase := s.phase
		if phase == "" {
			phase = def
		}
		p, err := policyFromPlan(s.plan, task, phase)
		if err != nil {
			return policy.Policy{}, "", usageError{err}
		}
		return p, phase, nil
	}
	return policy.Policy{}, "", nil
}

// baseline is the policy an environment of the role opens under: the one given, or the
// runtime default (public) when neither --policy nor --plan is. From a plan it is the
// role's own baseline: fresh mode's evaluation environment opens under
// evaluation_baseline, never under the agent's (docs/policy.md §7).
func (s *policySource) baseline(task string, role lifecycle.Role) (policy.Policy, error) {
	def := string(policy.PhaseBaseline)
	if role == lifecycle.RoleEvaluation {
		def = string(policy.PhaseEvaluationBaseline)
	}
	p, _, err := s.resolve(task, def)
	if err != nil {
		return policy.Policy{}, err
	}
	if !p.Mode.Valid() {
		return policy.Public, nil
	}
	return p, nil
}

func newEnvOpenCommand(f *envFlags) *cobra.Command {
	var (
		s     envSpecFlags
		image string
		env   []string
	)
	cmd := &cobra.Command{
		Use:   "open --task ID --image IMAGE [--plan FILE | --policy POLICY] [--env K=V]... [-- CMD...]",
		Short: "Create a task's networks, sidecar and agent container with the baseline policy in force",
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := s.spec("--image", image)
			if err != nil {
				return err
			}
			vars, err := parseEnvVars(env)
			if err != nil {
				return err
			}
			spec.Image, spec.Env, spec.Cmd = image, vars, args
			return f.create(cmd, func(ctx context.Context, p *docker.Provider) (*docker.Env, error) {
				return p.OpenEnv(ctx, spec)
			})
		},
	}
	s.bind(cmd, "task ID (names the environment's Docker objects)",
		"agent or evaluation (fresh mode's second environment, named <task>-eval)",
		"phase of --plan to open under (default baseline; evaluation_baseline with --role evaluation)")
	cmd.Flags().StringVar(&image, "image", "", "agent container image (present locally)")
	cmd.Flags().StringArrayVar(&env, "env", nil, "environment variable K=V for the agent (repeatable)")
	return cmd
}

// envSpecFlags are what open and attach share: the environment (--task, --role), the
// policy it opens under and how long its sidecar may take to start.
type envSpecFlags struct {
	taskFlags
	src     policySource
	timeout time.Duration
}

func (s *envSpecFlags) bind(cmd *cobra.Command, taskHelp, roleHelp, phaseHelp string) {
	cmd.Flags().StringVar(&s.task, "task", "", taskHelp)
	cmd.Flags().StringVar(&s.role, "role", string(lifecycle.RoleAgent), roleHelp)
	cmd.Flags().DurationVar(&s.timeout, "proxy-start-timeout", 30*time.Second, "how long the sidecar may take to become ready")
	s.src.bind(cmd, phaseHelp)
}

// spec checks the flags, and the command's own required flag (named flag, given value),
// before anything talks to Docker, and returns the environment's spec.
func (s *envSpecFlags) spec(flag, value string) (controller.EnvSpec, error) {
	role, err := s.parse()
	if err != nil {
		return controller.EnvSpec{}, err
	}
	if value == "" {
		return controller.EnvSpec{}, usageError{fmt.Errorf("%s is required", flag)}
	}
	baseline, err := s.src.baseline(s.task, role)
	if err != nil {
		return controller.EnvSpec{}, err
	}
	if err := checkProxyStartTimeout(s.timeout); err != nil {
		return controller.EnvSpec{}, err
	}
	return controller.EnvSpec{Task: s.task, Role: role, Baseline: baseline, ProxyStartTimeout: s.timeout}, nil
}

// create makes an environment with open's or attach's call, under a context that
// SIGINT and SIGTERM cancel so that a failed start still cleans up, and prints it.
func (f *envFlags) create(cmd *cobra.Command, call func(context.Context, *docker.Provider) (*docker.Env, error)) error {
	p, done, err := f.provider()
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := signalContext(cmd)
	defer cancel()
	start := time.Now()
	e, err := call(ctx, p)
	if err != nil {
		return err
	}
	r := describeEnv(e, time.Since(start))
	return f.print(cmd.OutOrStdout(), r, r.text)
}

func describeEnv(e *docker.Env, d time.Duration) openResult {
	return openResult{
		Env: e.ID(), Task: e.Task(), Agent: e.AgentContainer(), Sidecar: e.SidecarContainer(),
		Network: e.Network(), SidecarIP: e.SidecarAddr().String(), Duration: d,
	}
}

// checkProxyStartTimeout bounds --proxy-start-timeout as allowlist_proxy_start_timeout is
// bounded: the provider would silently replace zero or less by its default.
func checkProxyStartTimeout(d time.Duration) error {
	switch {
	case d <= 0:
		return usageError{fmt.Errorf("--proxy-start-timeout %s: must be positive", d)}
	case d > policy.MaxProxyStartTimeout:
		return usageError{fmt.Errorf("--proxy-start-timeout %s: must be at most %s", d, policy.MaxProxyStartTimeout)}
	}
	return nil
}

func parseEnvVars(list []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--env %q: want K=V", kv)}
		}
		if _, dup := out[k]; dup {
			return nil, usageError{fmt.Errorf("--env %q: %s is given twice", kv, k)}
		}
		out[k] = v
	}
	return out, nil
}

func newEnvAttachCommand(f *envFlags) *cobra.Command {
	var (
		s   envSpecFlags
		ctr string
	)
	cmd := &cobra.Command{
		Use:   "attach --task ID --container NAME_OR_ID [--plan FILE | --policy POLICY]",
		Short: "Bring a running container under control (refuses network modes none, host, container:<id>, and privileged or NET_ADMIN/SYS_ADMIN containers)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := s.spec("--container", ctr)
			if err != nil {
				return err
			}
			return f.create(cmd, func(ctx context.Context, p *docker.Provider) (*docker.Env, error) {
				return p.Attach(ctx, spec, ctr)
			})
		},
	}
	s.bind(cmd, "task ID", "agent or evaluation",
		"phase of --plan to attach under (default baseline; evaluation_baseline with --role evaluation)")
	cmd.Flags().StringVar(&ctr, "container", "", "the container to attach")
	return cmd
}
