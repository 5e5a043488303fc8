// Command probe is the static test binary of compass-egress: `compassctl env verify`
// runs it in a throwaway container that joins an agent's network namespace, and the e2e
// tests use it as the agent itself.
//
//	probe sleep                 wait for SIGTERM (an agent that does nothing)
//	probe check '<json>'        run checks (see Check), print the results as JSON
//	probe stream URL [PROXY] [SECONDS] [READY]
//	                            read URL's body, print when bytes arrived, as JSON
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the whole command but for the process: it returns the exit status, so that
// the tests can drive it.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		fmt.Fprintln(stderr, "usage: probe sleep | check JSON | stream URL [PROXY] [SECONDS] [READY]")
		return 2
	}
	switch args[0] {
	case "sleep":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
	case "check":
		if len(args) != 2 {
			fmt.Fprintln(stderr, "usage: probe check JSON")
			return 2
		}
		var checks []Check
		if err := json.Unmarshal([]byte(args[1]), &checks); err != nil {
			fmt.Fprintln(stderr, "probe: bad checks:", err)
			return 2
		}
		return emit(stdout, runChecks(checks))
	case "stream":
		if len(args) < 2 {
			fmt.Fprintln(stderr, "usage: probe stream URL [PROXY] [SECONDS] [READY]")
			return 2
		}
		return emit(stdout, stream(args[1:]))
	default:
		fmt.Fprintln(stderr, "probe: unknown command", args[0])
		return 2
	}
	return 0
}

func emit(w io.Writer, v any) int {
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return 1
	}
	return 0
}
