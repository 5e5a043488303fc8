package docker

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/compass-egress/compass-egress/net/dnsaddr"
	"github.com/compass-egress/compass-egress/net/egresslink"
)

// Defaults of Config.
const (
	DefaultStateDir      = "/var/lib/compass-egress"
	DefaultEgressNetwork = "compass-egress"
	DefaultProxyImage    = "compass-proxy:latest"
	DefaultProbeImage    = "compass-probe:latest"
	DefaultOwner         = "compassctl"
	DefaultSubnetBits    = 28
	defaultProxyTimeout  = 30 * time.Second
	proxyUID             = 65532 // the sidecar image's USER
	proxyPort            = 3128
	dnsPort              = 53
	// transparentPort is the sidecar's transparent listener, on every address: the
	// table in its namespace redirects the agent's TCP there (docs/docker.md).
	transparentPort = 15001
)

// DefaultPool is the private range per-task networks are carved from: 4096 /28s, none
// of them in Docker's default address pools.
var DefaultPool = netip.MustParsePrefix("10.213.0.0/16")

// Config says where the provider keeps its state and which names and images it uses.
type Config struct {
	StateDir      string       // per-environment admin sockets, intended state, transitions
	EgressNetwork string       // the shared network with a way out
	Pool          netip.Prefix // address range of the per-task internal networks
	SubnetBits    int          // prefix length of one per-task network
	ProxyImage    string       // the compass-proxy sidecar image
	ProbeImage    string       // the verify probe image
	DNSUpstreams  []string     // resolvers the sidecar forwards allowed names to: IP addresses, port optional (53)
	Owner         string       // label value marking what this controller owns
	Clock         Clock        // time source of transition records and durations
	ExtraProxyArg []string     // extra compass-proxy flags (tests: --allow-internal ...)
	ProxyEnv      map[string]string
	// StepDelay pauses between the steps of a switch. Tests only: it lets a kill of the
	// controller land in the middle of a switch.
	StepDelay time.Duration
}

// withDefaults fills every unset field.
func (c Config) withDefaults() Config {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.EgressNetwork == "" {
		c.EgressNetwork = DefaultEgressNetwork
	}
	if !c.Pool.IsValid() {
		c.Pool = DefaultPool
	}
	if c.SubnetBits == 0 {
		c.SubnetBits = DefaultSubnetBits
	}
	if c.ProxyImage == "" {
		c.ProxyImage = DefaultProxyImage
	}
	if c.ProbeImage == "" {
		c.ProbeImage = DefaultProbeImage
	}
	if c.Owner == "" {
		c.Owner = DefaultOwner
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c
}

func (c Config) validate() error {
	if !c.Pool.Addr().Is4() || c.Pool.Masked() != c.Pool {
		return fmt.Errorf("docker: pool %s: want a canonical IPv4 prefix", c.Pool)
	}
	if c.SubnetBits < c.Pool.Bits() || c.SubnetBits > 29 {
		return fmt.Errorf("docker: subnet size /%d does not fit pool %s (want /%d../29)", c.SubnetBits, c.Pool, c.Pool.Bits())
	}
	if n := 1 << (c.SubnetBits - c.Pool.Bits()); n > egresslink.Slots {
		return fmt.Errorf("docker: pool %s holds %d /%d subnets, more than the %d transparent links there are addresses for: use a smaller pool or larger subnets", c.Pool, n, c.SubnetBits, egresslink.Slots)
	}
	if !nameRE.MatchString(c.EgressNetwork) {
		return fmt.Errorf("docker: egress network name %q is not a valid Docker name", c.EgressNetwork)
	}
	// Checked here, by the sidecar's own rule, so that a bad resolver fails the command
	// rather than every sidecar it starts.
	for _, u := range c.DNSUpstreams {
		if _, err := dnsaddr.ParseUpstream(u); err != nil {
			return fmt.Errorf("docker: dns upstream %q: %w", u, err)
		}
	}
	for _, a := range c.ExtraProxyArg {
		if name, ok := unsafeProxyFlag(a); ok {
			return fmt.Errorf("docker: proxy arg %q: --%s is the controller's: a sidecar starts (and comes back after a restart) as no-network, ready only with forwarding off", a, name)
		}
	}
	// compass-proxy reads every flag not given from its variable: the same settings are
	// refused there.
	for k, v := range c.ProxyEnv {
		name, ok := strings.CutPrefix(k, proxyEnvPrefix)
		if ok && unsafeProxySetting(strings.ToLower(strings.ReplaceAll(name, "_", "-")), v, true) {
			return fmt.Errorf("docker: proxy env %s=%q: the controller's setting: a sidecar starts (and comes back after a restart) as no-network, ready only with forwarding off", k, v)
		}
	}
	return nil
}

// proxyEnvPrefix starts the variable compass-proxy reads for each of its flags
// (COMPASS_PROXY_ and the flag's name in upper case, '-' as '_').
const proxyEnvPrefix = "COMPASS_PROXY_"

// unsafeProxyFlag reports an extra compass-proxy flag that would undo what the controller
// relies on: --policy gives the sidecar another first policy, which it would also come
// back with after any restart (and re-read on SIGHUP); --require-no-forwarding=false lets
// a forwarding sidecar become ready; --transparent-listen moves (or turns off) the
// listener the table sends the agent's TCP to.
func unsafeProxyFlag(arg string) (string, bool) {
	if !strings.HasPrefix(arg, "-") {
		return "", false
	}
	name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-"), "=")
	return name, unsafeProxySetting(name, value, hasValue)
}

// unsafeProxySetting reports whether setting compass-proxy's flag name (to value, if
// hasValue) is one unsafeProxyFlag refuses.
func unsafeProxySetting(name, value string, hasValue bool) bool {
	switch name {
	case "policy", "transparent-listen":
		return true
	case "require-no-forwarding":
		on, err := strconv.ParseBool(value)
		return hasValue && (err != nil || !on)
	}
	return false
}

// Clock is the provider's time source.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
}

type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) Since(t time.Time) time.Duration { return time.Since(t) }

// Docker names: the task ID becomes part of container and network names.
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidateTask rejects a task ID that cannot name Docker objects.
func ValidateTask(task string) error {
	if !nameRE.MatchString(task) {
		return fmt.Errorf("docker: task ID %q: use 1-63 characters of [a-zA-Z0-9_.-], starting with a letter or digit", task)
	}
	return nil
}

// Label keys. Container labels are immutable, so they hold only what never changes;
// the intended policy lives in the state directory and the acknowledged one in the sidecar.
const (
	labelManaged     = "compass-egress.managed"
	labelOwner       = "compass-egress.owner"
	labelEnv         = "compass-egress.env"
	labelTask        = "compass-egress.task"
	labelEnvRole     = "compass-egress.env-role" // agent or evaluation (lifecycle.Role)
	labelRole        = "compass-egress.role"     // network, sidecar, agent, probe
	labelAgent       = "compass-egress.agent"    // on the sidecar: the agent container's ID
	labelAgentOwned  = "compass-egress.agent-owned"
	labelCreatedUnix = "compass-egress.created"
)

// Object roles (labelRole values).
const (
	roleNetwork = "network"
	roleEgress  = "egress"
	roleSidecar = "sidecar"
	roleAgent   = "agent"
	roleProbe   = "probe"
)

// names of one environment's Docker objects.
type names struct {
	Env, Network, Sidecar, Agent string
}

func namesFor(env string) names {
	return names{Env: env, Network: "compass-net-" + env, Sidecar: "compass-proxy-" + env, Agent: "compass-agent-" + env}
}
