package proxy

import (
	"net/http"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/blocked"
	"github.com/compass-egress/compass-egress/proxy/upclient"
)

// Apply puts p in force. task and phase relabel logs and metrics when not nil; nil
// keeps the current labels. When Apply returns, every new decision uses p and every
// live connection that p no longer allows is closed.
func (s *Server) Apply(p policy.Policy, task, phase *string, source string) adminapi.ApplyResult {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	old := s.current.Load()
	rs := &RuleSet{
		Policy:    p,
		Matcher:   policy.Compile(p),
		Digest:    p.Digest(),
		addrPorts: newAddrRulePorts(p),
		Applied:   time.Now(),
		blocked:   blocked.New(),
		transport: s.newTransport(),
		upstream:  upclient.New(upclient.Config{Dialer: upstreamDialer{s}, IdleTimeout: s.cfg.IdleTimeout, ReadIdleTimeout: s.cfg.TunnelIdleTimeout}),
	}
	if old != nil {
		rs.Generation, rs.Task, rs.Phase = old.Generation+1, old.Task, old.Phase
	} else {
		rs.Generation = 1
	}
	if task != nil {
		rs.Task = *task
	}
	if phase != nil {
		rs.Phase = *phase
	}
	s.current.Store(rs)
	if s.ownResolver != nil {
		s.ownResolver.StartAfresh()
	}

	closed := 0
	var prev *adminapi.BlockedSummary
	if old != nil {
		// Published first, swept second: a connection registered after the sweep
		// re-reads the pointer and sees rs (see tracker.closeIf).
		closed = s.tracker.closeIf(func(c *liveConn) bool {
			if c.recheck != nil {
				return !c.recheck(rs)
			}
			helloOK, _, _ := helloDecision(rs, c.serverName, c.encryptedHello, c.port)
			return !helloOK || !s.decider.Recheck(rs, c.name, c.addr, c.port)
		})
		old.closeIdle()
		summary := old.blocked.Summary(old.Generation)
		prev = &summary
	}
	s.metrics.generation.Set(float64(rs.Generation))
	s.metrics.reloads.WithLabelValues("success").Inc()
	s.metrics.reloadOK.Set(1)
	s.metrics.swapClosed.Add(float64(closed))
	s.log.Info("policy applied", "source", source, "generation", rs.Generation, "digest", rs.Digest,
		"mode", string(p.Mode), "rules", len(p.Targets), "task", rs.Task, "phase", rs.Phase,
		"closed_connections", closed)
	return adminapi.ApplyResult{PolicyStatus: rs.status(), ClosedConnections: uint64(closed), PreviousBlocked: prev}
}

// rejected records a policy that could not be applied; the running one stays.
func (s *Server) rejected(source string, err error) {
	// Under the lock, so that the last-reload gauge follows the order of the reloads.
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.metrics.reloads.WithLabelValues("failure").Inc()
	s.metrics.reloadOK.Set(0)
	s.log.Error("policy rejected; the previous policy stays in force", "source", source,
		"generation", s.current.Load().Generation, "error", err.Error())
}

// Reload re-reads the policy file (SIGHUP). A missing or invalid file is rejected and
// the running policy stays.
func (s *Server) Reload() error {
	if s.cfg.PolicyFile == "" {
		// Said, so that an operator who expected a reload sees why none came.
		s.log.Info("SIGHUP: no --policy file to re-read; the running policy stays", "generation", s.current.Load().Generation)
		return nil
	}
	p, err := readPolicyFile(s.cfg.PolicyFile)
	if err != nil {
		s.rejected("sighup", err)
		return err
	}
	s.Apply(p, nil, nil, "sighup")
	return nil
}

// newTransport is one generation's upstream HTTP client. It never consults proxy
// environment variables and dials only addresses a decision checked. An upstream that
// sends no byte of the answer head for the tunnel idle timeout after the request was
// written ends the request (see headWatch: ResponseHeaderTimeout would bound the whole
// head, interim answers included, by that timeout).
func (s *Server) newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            s.dialChecked,
		MaxIdleConns:           upclient.MaxIdle,
		MaxIdleConnsPerHost:    upclient.MaxIdlePerUpstream,
		IdleConnTimeout:        s.cfg.IdleTimeout,
		TLSHandshakeTimeout:    s.cfg.DialTimeout,
		MaxResponseHeaderBytes: upclient.MaxAnswerHeadBytes,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true,
	}
}
