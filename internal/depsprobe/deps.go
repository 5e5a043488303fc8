package depsprobe

import (
	_ "github.com/docker/docker/api/types/container"
	_ "github.com/docker/docker/api/types/network"
	_ "github.com/docker/docker/api/types/image"
	_ "github.com/docker/docker/api/types/filters"
	_ "github.com/docker/docker/client"
	_ "github.com/docker/docker/pkg/stdcopy"
	_ "github.com/elazarl/goproxy"
	_ "github.com/miekg/dns"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/spf13/cobra"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/net/idna"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/term"
)
