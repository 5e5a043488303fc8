// Command demo is the demo's agent and grader: one static multi-call binary for images
// built FROM scratch, which have no shell and no tools. Called by the name it is
// installed under (/bin/fetch, /bin/agent, ...) or as `demo NAME ARGS...`:
//
//	demo                      sleep until stopped (the container's main process)
//	sleep [DURATION]          sleep for DURATION, or until stopped
//	fetch URL [-o FILE] [--who NAME] [--as TEXT]
//	                          GET through the proxy variables; save the body
//	recon NAME -o FILE        resolve NAME and try it directly, by TCP and UDP (a set-up
//	                          step that learns an address while the network is open)
//	agent --model URL --exfil URL [--ssh HOST:PORT] [--recon FILE] [--answer FILE]
//	                          the rollout: the model and exfiltration through the proxy,
//	                          then as a client that ignores the proxy variables: the model,
//	                          exfiltration by name and by IP, an SSH-like exchange, and
//	                          exfiltration over UDP and DNS
//	pack OUT.tar PATH...      write a tar archive (there is no tar in the image)
//	procs                     list the processes other than init and itself; fail if
//	                          there are any (a cut step must leave nothing running)
//	grade --judge URL --exfil URL ARCHIVE
//	                          check the archive, ask the judge, try to leak the answer
//
// Every network attempt prints one JSON line: who, attempt, target, outcome (reached or
// blocked) and a detail; the demo's table is made from these lines. An attempt reached
// its target only if the real destination answered (the fake internet's own reply), not
// if a connection opened: in a restricted mode every TCP connection opens, to the sidecar.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// attemptTimeout bounds each network attempt: a blocked attempt fails fast or times out.
const attemptTimeout = 3 * time.Second

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "demo" {
		if len(args) == 0 {
			sleep()
			return
		}
		name, args = args[0], args[1:]
	}
	var err error
	switch name {
	case "sleep":
		err = sleepFor(args)
	case "fetch":
		err = fetch(args)
	case "recon":
		err = recon(args)
	case "agent":
		err = agent(args)
	case "pack":
		err = pack(args)
	case "grade":
		err = grade(args)
	case "procs":
		err = procs()
	default:
		err = fmt.Errorf("unknown command %q (fetch, recon, agent, pack, grade, procs, sleep)", name)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// sleepFor sleeps for the given duration, or until stopped without one.
func sleepFor(args []string) error {
	if len(args) == 0 {
		sleep()
		return nil
	}
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return err
	}
	time.Sleep(d)
	return nil
}

func sleep() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// Attempt is one network attempt as the demo reports it.
type Attempt struct {
	Who     string `json:"who"`
	Attempt string `json:"attempt"`
	Target  string `json:"target"`
	Outcome string `json:"outcome"` // reached or blocked
	Detail  string `json:"detail"`
}

func report(who, attempt, target string, err error, detail string) bool {
	a := Attempt{Who: who, Attempt: attempt, Target: target, Outcome: "reached", Detail: detail}
	if err != nil {
		a.Outcome, a.Detail = "blocked", err.Error()
	}
	b, _ := json.Marshal(a)
	fmt.Println(string(b))
	return err == nil
}

func fetch(args []string) error {
	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	out := fs.String("o", "", "file to save the body in (default /work/<last path element>)")
	who := fs.String("who", "setup", "who makes the attempt, for the report")
	what := fs.String("as", "fetch a package", "what the attempt is, for the report")
	if err := parseAnywhere(fs, args); err != nil || fs.NArg() != 1 {
		return errors.New("usage: fetch URL [-o FILE] [--who NAME] [--as TEXT]")
	}
	url := fs.Arg(0)
	body, err := httpAttempt(http.MethodGet, url, route{viaProxy: true})
	if !report(*who, *what, url, err, fmt.Sprintf("%d bytes", len(body))) {
		return err
	}
	if *out == "" {
		*out = filepath.Join("/work", filepath.Base(url))
	}
	return writeFile(*out, []byte(body))
}

// parseAnywhere parses flags placed before, between or after the positional arguments
// (flag.Parse stops at the first positional one), leaving the positionals in fs.Args.
func parseAnywhere(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
