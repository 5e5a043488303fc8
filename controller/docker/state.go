package docker

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// stateDir is one environment's directory under Config.StateDir:
//
//	admin/             bind-mounted at /run/compass in the sidecar (admin.sock)
//	resolv.conf        bind-mounted read-only at /etc/resolv.conf in a created agent
//	intended.json      the policy the controller last set out to put in force
//	transitions.jsonl  one line per switch
type stateDir string

func (s stateDir) admin() string       { return filepath.Join(string(s), "admin") }
func (s stateDir) socket() string      { return filepath.Join(s.admin(), "admin.sock") }
func (s stateDir) intended() string    { return filepath.Join(string(s), "intended.json") }
func (s stateDir) transitions() string { return filepath.Join(string(s), "transitions.jsonl") }
func (s stateDir) resolvConf() string  { return filepath.Join(string(s), "resolv.conf") }

// writeResolvConf writes the agent's resolv.conf: the sidecar is its only resolver.
func (s stateDir) writeResolvConf(sidecar netip.Addr) (string, error) {
	data := "# written by compass-egress: the sidecar is the only resolver\nnameserver " + sidecar.String() + "\noptions ndots:0\n"
	if err := os.WriteFile(s.resolvConf(), []byte(data), 0o644); err != nil {
		return "", fmt.Errorf("state: %w", err)
	}
	return s.resolvConf(), nil
}

// intent is written before a switch starts, so that a controller killed mid-switch
// leaves behind what it meant to do: status compares it with what it finds, and switch
// to it repairs.
type intent struct {
	Policy policy.Policy `json:"policy"`
	Digest string        `json:"digest"`
	Phase  string        `json:"phase"`
	Time   time.Time     `json:"time"`
}

func (s stateDir) create() error {
	if err := os.MkdirAll(s.admin(), 0o750); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	// The sidecar runs as an unprivileged user and creates its socket here. Only root
	// can hand the directory over (and only root can drive Docker and namespaces).
	if os.Geteuid() != 0 {
		return nil
	}
	if err := os.Chown(s.admin(), proxyUID, proxyUID); err != nil {
		return fmt.Errorf("state: chown %s: %w", s.admin(), err)
	}
	return nil
}

func (s stateDir) writeIntent(in intent) error {
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("state: encode intent: %w", err)
	}
	tmp := s.intended() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.Rename(tmp, s.intended()); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// readIntent returns the last intent; ok is false when none was written.
func (s stateDir) readIntent() (in intent, ok bool, err error) {
	b, err := os.ReadFile(s.intended())
	if errors.Is(err, os.ErrNotExist) {
		return intent{}, false, nil
	}
	if err != nil {
		return intent{}, false, fmt.Errorf("state: %w", err)
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return intent{}, false, fmt.Errorf("state: %s: %w", s.intended(), err)
	}
	return in, true, nil
}

func (s stateDir) appendTransition(t controller.Transition) error {
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("state: encode transition: %w", err)
	}
	f, err := os.OpenFile(s.transitions(), os.O_APPEND|os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	line := append(b, '\n')
	// A write cut short (a full disk, a kill) leaves a fragment without its newline:
	// this record starts a line of its own rather than join the fragment as one line
	// that nothing can read.
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			line = append([]byte{'\n'}, line...)
		}
	}
	_, werr := f.Write(line)
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("state: append transition: %w", werr)
	}
	if cerr != nil {
		return fmt.Errorf("state: append transition: %w", cerr)
	}
	return nil
}

// lastTransitions returns up to n of the most recent transitions.
func (s stateDir) lastTransitions(n int) ([]controller.Transition, error) {
	f, err := os.Open(s.transitions())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	defer f.Close()
	var all []controller.Transition
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		var t controller.Transition
		if json.Unmarshal(sc.Bytes(), &t) == nil {
			all = append(all, t)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("state: read transitions: %w", err)
	}
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return all, nil
}
