package proxybench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The peers are configured as plain forwarding proxies for loopback clients: no cache,
// no access log, no Via header, file descriptors enough for the idle-tunnel test. Each
// runs in the foreground, as a child of the benchmark, with its files in dir.

// StartSquid runs squid (binary path bin) with a minimal configuration in dir and that
// many worker processes (0 or 1: squid's default, one).
func StartSquid(bin, dir string, workers int) (*Process, error) {
	addr, err := FreePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "squid.conf")
	if err := writeSquidConf(conf, dir, addr, workers, os.Geteuid() == 0); err != nil {
		return nil, fmt.Errorf("proxybench: squid: %w", err)
	}
	return StartProcess("squid", dir, addr, 20*time.Second, bin, "--foreground", "-f", conf)
}

// writeSquidConf writes squid's configuration for StartSquid to path.
func writeSquidConf(path, dir, addr string, workers int, root bool) error {
	lines := []string{
		"http_port " + addr,
		"http_access allow all",
		"cache deny all",
		"cache_mem 8 MB",
		"access_log none",
		"cache_store_log none",
		"cache_log " + filepath.Join(dir, "squid-cache.log"),
		"pid_filename " + filepath.Join(dir, "squid.pid"),
		"coredump_dir " + dir,
		"max_filedescriptors 16384",
		"shutdown_lifetime 0 seconds",
		"visible_hostname proxybench.test",
		"via off",
		"forwarded_for delete",
		"pinger_enable off",
		"netdb_filename none",
	}
	if workers > 1 {
		lines = append(lines, fmt.Sprintf("workers %d", workers))
	}
	if root {
		// Squid refuses to keep root; its unprivileged user must be able to write dir.
		lines = append(lines, "cache_effective_user proxy")
		if err := os.Chmod(dir, 0o777); err != nil {
			return err
		}
	}
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// StartTinyproxy runs tinyproxy (binary path bin) with a minimal configuration in dir.
func StartTinyproxy(bin, dir string) (*Process, error) {
	addr, err := FreePort()
	if err != nil {
		return nil, err
	}
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	lines := []string{
		"Port " + port,
		"Listen 127.0.0.1",
		"Timeout 600",
		"MaxClients 8192",
		"LogLevel Critical",
		`LogFile "` + filepath.Join(dir, "tinyproxy-own.log") + `"`,
		`PidFile "` + filepath.Join(dir, "tinyproxy.pid") + `"`,
		"Allow 127.0.0.1",
		"DisableViaHeader Yes",
	}
	conf := filepath.Join(dir, "tinyproxy.conf")
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("proxybench: tinyproxy: %w", err)
	}
	return StartProcess("tinyproxy", dir, addr, 20*time.Second, bin, "-d", "-c", conf)
}

// StartCompass runs compass-proxy (binary path bin) with the policy document policyJSON,
// allowing loopback upstreams, with DNS and metrics listeners off, and any further flags.
func StartCompass(name, bin, dir string, policyJSON []byte, extra ...string) (*Process, error) {
	addr, err := FreePort()
	if err != nil {
		return nil, err
	}
	argv, err := compassArgv(name, bin, dir, addr, policyJSON)
	if err != nil {
		return nil, err
	}
	return StartProcess(name, dir, addr, 60*time.Second, append(argv, extra...)...)
}

// compassArgv writes policyJSON to dir and returns the command line of a compass-proxy
// listening on addr, with every flag the benchmark's compass-proxy runs share.
func compassArgv(name, bin, dir, addr string, policyJSON []byte) ([]string, error) {
	policyFile := filepath.Join(dir, name+"-policy.json")
	if err := os.WriteFile(policyFile, policyJSON, 0o644); err != nil {
		return nil, fmt.Errorf("proxybench: %s: %w", name, err)
	}
	return []string{bin,
		"--listen", addr,
		"--dns-listen", "",
		// Never asked (destinations are address literals), but compass-proxy refuses to
		// start without an upstream, and the host's resolv.conf may list none.
		"--dns-upstream", "127.0.0.1:53",
		"--metrics-listen", "",
		"--admin-socket", filepath.Join(dir, name+"-admin.sock"),
		"--policy", policyFile,
		"--allow-internal", "127.0.0.0/8",
		"--require-no-forwarding=false",
	}, nil
}
