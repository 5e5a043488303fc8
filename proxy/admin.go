package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/compass-egress/compass-egress/policy"
)

// maxPolicyBody bounds a PUT body. An allowlist of 100k entries is 2 to 5 MiB as the
// controller writes it (names of 15 to 43 bytes) and 25 MiB when every entry is a
// 253-byte name with a port, so 32 MiB holds the largest such list.
const maxPolicyBody = 32 << 20

// PolicyStatus is GET /v1/policy.
type PolicyStatus struct {
	Generation uint64        `json:"generation"`
	Digest     string        `json:"digest"`
	Mode       policy.Mode   `json:"mode"`
	Policy     policy.Policy `json:"policy"`
	Task       string        `json:"task"`
	Phase      string        `json:"phase"`
}

// apiError is a 4xx body: the summary and, for validation failures, each problem.
type apiError struct {
	Error  string   `json:"error"`
	Errors []string `json:"errors"`
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/policy", s.putPolicy)
	mux.HandleFunc("GET /v1/policy", s.getPolicy)
	mux.HandleFunc("GET /v1/blocked", s.getBlocked)
	// The controller reads the metrics here: nothing on the sandbox's network can.
	s.metricsRoute(mux)
	s.healthRoutes(mux)
	return mux
}

func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	s.metricsRoute(mux)
	s.healthRoutes(mux)
	return mux
}

func (s *Server) metricsRoute(mux *http.ServeMux) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
}

func (s *Server) healthRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := s.Ready(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) {
	// A declared length over the bound is refused before any of the body is read.
	if r.ContentLength > maxPolicyBody {
		s.policyTooLarge(w)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPolicyBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		s.policyTooLarge(w)
		return
	}
	if err != nil {
		s.badPolicy(w, fmt.Errorf("proxy: read body: %w", err))
		return
	}
	p, task, phase, err := parsePolicyBody(body)
	if err != nil {
		s.badPolicy(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.Apply(p, task, phase, "admin"))
}

func (s *Server) badPolicy(w http.ResponseWriter, err error) {
	s.rejected("admin", err)
	e := apiError{Error: "invalid policy; the running policy is unchanged", Errors: []string{}}
	if fes := policy.FieldErrors(err); len(fes) > 0 {
		for _, fe := range fes {
			e.Errors = append(e.Errors, fe.Error())
		}
	} else {
		e.Errors = append(e.Errors, err.Error())
	}
	writeJSON(w, http.StatusBadRequest, e)
}

// policyTooLarge answers a body over maxPolicyBody: 413, naming the bound, which is the
// sender's to fix (a 400 would say the policy itself is wrong).
func (s *Server) policyTooLarge(w http.ResponseWriter) {
	err := fmt.Errorf("proxy: policy body larger than %d bytes (%d MiB), the limit", maxPolicyBody, maxPolicyBody>>20)
	s.rejected("admin", err)
	writeJSON(w, http.StatusRequestEntityTooLarge, apiError{Error: "policy too large; the running policy is unchanged", Errors: []string{err.Error()}})
}

var envelopeKeys = map[string]bool{"policy": true, "task": true, "phase": true}

// An envelope's unknown keys are reported up to maxEnvelopeKeyErrors, each clipped as
// the policy package clips user text: the body may be 32 MiB, its error answer should
// not be.
const (
	maxEnvelopeKeyErrors = 10
	maxLabelBytes        = 128 // task and phase
)

// parsePolicyBody accepts the wire-format policy itself or the envelope
// {"policy": ..., "task": "...", "phase": "..."} (a policy object never has a "policy"
// key, so the two cannot be confused).
func parsePolicyBody(body []byte) (policy.Policy, *string, *string, error) {
	v, err := policy.DecodeJSON(body)
	if err != nil {
		return policy.Policy{}, nil, nil, err
	}
	obj, ok := v.(map[string]any)
	if _, envelope := obj["policy"]; !ok || !envelope {
		p, err := policy.ParseValue(v, "")
		return p, nil, nil, err
	}
	var errs policy.ErrorList
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	unknown := 0
	for _, k := range keys {
		if envelopeKeys[k] {
			continue
		}
		if unknown++; unknown <= maxEnvelopeKeyErrors {
			errs = append(errs, &policy.FieldError{Path: policy.Clip(k), Rule: "unknown key; the envelope takes only policy, task and phase"})
		}
	}
	if unknown > maxEnvelopeKeyErrors {
		errs = append(errs, &policy.FieldError{Rule: fmt.Sprintf("and %d more unknown keys", unknown-maxEnvelopeKeyErrors)})
	}
	label := func(k string) *string {
		raw, present := obj[k]
		if !present {
			return nil
		}
		s, ok := raw.(string)
		if !ok {
			errs = append(errs, &policy.FieldError{Path: k, Rule: "must be a string"})
			return nil
		}
		if !validLabel(s) {
			errs = append(errs, &policy.FieldError{Path: k, Value: policy.Quote(s), Rule: labelRule})
			return nil
		}
		return &s
	}
	task, phase := label("task"), label("phase")
	p, err := policy.ParseValue(obj["policy"], "policy")
	if err != nil {
		errs = append(errs, policy.FieldErrors(err)...)
	}
	if len(errs) > 0 {
		return policy.Policy{}, nil, nil, errs
	}
	return p, task, phase, nil
}

func (s *Server) getPolicy(w http.ResponseWriter, _ *http.Request) {
	rs := s.current.Load()
	writeJSON(w, http.StatusOK, PolicyStatus{Generation: rs.Generation, Digest: rs.Digest,
		Mode: rs.Mode(), Policy: rs.Policy, Task: rs.Task, Phase: rs.Phase})
}

func (s *Server) getBlocked(w http.ResponseWriter, _ *http.Request) {
	rs := s.current.Load()
	writeJSON(w, http.StatusOK, rs.blocked.summary(rs.Generation))
}

// Healthcheck asks the admin socket's /readyz; nil means ready. The image's
// HEALTHCHECK runs it (the image has no shell and no curl).
func Healthcheck(ctx context.Context, socket string) error {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://admin/readyz", nil)
	if err != nil {
		return fmt.Errorf("proxy: healthcheck: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("proxy: healthcheck: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return errors.New("proxy: healthcheck: " + string(msg))
	}
	return nil
}

// labelRule is what a task or phase label must be, from the admin API or from Config:
// labels go into every decision's log line.
var labelRule = fmt.Sprintf("must be at most %d bytes of UTF-8 text without control characters", maxLabelBytes)

func validLabel(s string) bool {
	return len(s) <= maxLabelBytes && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}
