package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/policy"
)

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT "+adminapi.PathPolicy, s.putPolicy)
	mux.HandleFunc("GET "+adminapi.PathPolicy, s.getPolicy)
	mux.HandleFunc("GET "+adminapi.PathBlocked, s.getBlocked)
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
	mux.Handle("GET "+adminapi.PathMetrics, promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
}

func (s *Server) healthRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+adminapi.PathLivez, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET "+adminapi.PathReadyz, func(w http.ResponseWriter, _ *http.Request) {
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
	if r.ContentLength > adminapi.MaxPolicyBody {
		s.policyTooLarge(w)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, adminapi.MaxPolicyBody))
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
	e := adminapi.ErrorBody{Error: "invalid policy; the running policy is unchanged", Errors: []string{}}
	if fes := policy.FieldErrors(err); len(fes) > 0 {
		for _, fe := range fes {
			e.Errors = append(e.Errors, fe.Error())
		}
	} else {
		e.Errors = append(e.Errors, err.Error())
	}
	writeJSON(w, http.StatusBadRequest, e)
}

// policyTooLarge answers a body over MaxPolicyBody: 413, naming the bound, which is the
// sender's to fix (a 400 would say the policy itself is wrong).
func (s *Server) policyTooLarge(w http.ResponseWriter) {
	err := fmt.Errorf("proxy: policy body larger than %d bytes (%d MiB), the limit", adminapi.MaxPolicyBody, adminapi.MaxPolicyBody>>20)
	s.rejected("admin", err)
	writeJSON(w, http.StatusRequestEntityTooLarge, adminapi.ErrorBody{Error: "policy too large; the running policy is unchanged", Errors: []string{err.Error()}})
}

var envelopeKeys = map[string]bool{"policy": true, "task": true, "phase": true}

// An envelope's unknown keys are reported up to maxEnvelopeKeyErrors, each clipped as
// the policy package clips user text: the body may be 32 MiB, its error answer should
// not be.
const maxEnvelopeKeyErrors = 10

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
		if !adminapi.ValidLabel(s) {
			errs = append(errs, &policy.FieldError{Path: k, Value: policy.Quote(s), Rule: adminapi.LabelRule})
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
	writeJSON(w, http.StatusOK, rs.status())
}

// status is what GET /v1/policy says of rs, and a swap's answer of the rule set it
// put in force.
func (rs *RuleSet) status() adminapi.PolicyStatus {
	return adminapi.PolicyStatus{Generation: rs.Generation, Digest: rs.Digest, Mode: rs.Mode(),
		Policy: rs.Policy, Task: rs.Task, Phase: rs.Phase}
}

func (s *Server) getBlocked(w http.ResponseWriter, _ *http.Request) {
	rs := s.current.Load()
	writeJSON(w, http.StatusOK, rs.blocked.Summary(rs.Generation))
}
