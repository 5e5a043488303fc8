// Command probe is the static test binary of compass-egress: `compassctl env verify`
// runs it in a throwaway container that joins an agent's network namespace, and the e2e
// tests use it as the agent itself.
//
//	probe sleep                 wait for SIGTERM (an agent that does nothing)
//	probe check '<json>'        run checks (see Check), print the results as JSON
//	probe stream URL [PROXY]    read URL's body, print when bytes arrived, as JSON
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe sleep | check JSON | stream URL [PROXY] [SECONDS]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "sleep":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
	case "check":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: probe check JSON")
			os.Exit(2)
		}
		var checks []Check
		if err := json.Unmarshal([]byte(os.Args[2]), &checks); err != nil {
			fmt.Fprintln(os.Stderr, "probe: bad checks:", err)
			os.Exit(2)
		}
		emit(runChecks(checks))
	case "stream":
		if len(os.Args) < 3 {
			fmt.Fprintln(os.Stderr, "usage: probe stream URL [PROXY] [SECONDS]")
			os.Exit(2)
		}
		emit(stream(os.Args[2:]))
	default:
		fmt.Fprintln(os.Stderr, "probe: unknown command", os.Args[1])
		os.Exit(2)
	}
}

func emit(v any) {
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(v); err != nil {
		os.Exit(1)
	}
}
