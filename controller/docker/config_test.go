package docker

import (
	"fmt"
	"strings"
	"testing"
)

// A resolver the sidecar would refuse fails New, naming the value and the rule, rather
// than every sidecar later started with it.
func TestConfigDNSUpstreams(t *testing.T) {
	for _, tc := range []struct {
		upstream string
		want     string // "" if accepted
	}{
		{"10.0.0.2", ""},
		{"10.0.0.2:5353", ""},
		{"[fd00::2]:53", ""},
		{"fd00::2", ""},
		{"resolver.test:53", `docker: dns upstream "resolver.test:53": want an IP address with an optional port`},
		{"10.0.0.2:0", `docker: dns upstream "10.0.0.2:0": port 0`},
		{"", `docker: dns upstream "": want an IP address`},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			_, err := New(nil, Config{StateDir: t.TempDir(), DNSUpstreams: []string{"10.0.0.1", tc.upstream}}, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("error %v, want it to start %q", err, tc.want)
			}
		})
	}
}

// A sidecar must start, and come back after any restart, as no-network: an extra flag
// that gives it another first policy (re-read on SIGHUP too), or lets it become ready
// while forwarding, is refused.
func TestConfigRefusesUnsafeProxyArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" if accepted
	}{
		{[]string{"--allow-internal", "10.0.0.0/8"}, ""},
		{[]string{"--log-level=debug"}, ""},
		{[]string{"--require-no-forwarding=true"}, ""},
		{[]string{"--policy", "/etc/public.yaml"}, `docker: proxy arg "--policy"`},
		{[]string{"-policy=/etc/public.yaml"}, `docker: proxy arg "-policy=/etc/public.yaml"`},
		{[]string{"--require-no-forwarding=false"}, `docker: proxy arg "--require-no-forwarding=false"`},
		{[]string{"--transparent-listen="}, `docker: proxy arg "--transparent-listen="`},
		{[]string{"--transparent-listen", ":15002"}, `docker: proxy arg "--transparent-listen"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := New(nil, Config{StateDir: t.TempDir(), ExtraProxyArg: tc.args}, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("error %v, want it to start %q", err, tc.want)
			}
		})
	}
}

// compass-proxy fills every flag not given from COMPASS_PROXY_<FLAG>: the sidecar's
// environment must not do what the same flag is refused for.
func TestConfigRefusesUnsafeProxyEnv(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string // "" if accepted
	}{
		{map[string]string{"COMPASS_PROXY_LOG_LEVEL": "debug"}, ""},
		{map[string]string{"COMPASS_PROXY_REQUIRE_NO_FORWARDING": "true"}, ""},
		{map[string]string{"COMPASS_PROXY_POLICY": "/etc/public.yaml"}, `docker: proxy env COMPASS_PROXY_POLICY`},
		{map[string]string{"COMPASS_PROXY_REQUIRE_NO_FORWARDING": "0"}, `docker: proxy env COMPASS_PROXY_REQUIRE_NO_FORWARDING`},
		{map[string]string{"COMPASS_PROXY_TRANSPARENT_LISTEN": ""}, `docker: proxy env COMPASS_PROXY_TRANSPARENT_LISTEN`},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			_, err := New(nil, Config{StateDir: t.TempDir(), ProxyEnv: tc.env}, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("error %v, want it to start %q", err, tc.want)
			}
		})
	}
}
