package proxy

import (
	"runtime"

	"github.com/compass-egress/compass-egress/internal/buildinfo"
	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the proxy's Prometheus series. Labels are bounded sets (types, decisions,
// reason codes, DNS types): never a host, an address or a task name.
type metrics struct {
	registry   *prometheus.Registry
	requests   *prometheus.CounterVec
	dnsQueries *prometheus.CounterVec
	active     *prometheus.GaugeVec
	bytes      *prometheus.CounterVec
	// The series of active and bytes, resolved once: a label lookup per connection
	// is a hash and a lock.
	activeHTTP, activeConnect prometheus.Gauge
	activeTransparent         prometheus.Gauge
	bytesUp, bytesDown        prometheus.Counter
	dialDuration              prometheus.Histogram
	generation                prometheus.Gauge
	reloads                   *prometheus.CounterVec
	reloadOK                  prometheus.Gauge
	swapClosed                prometheus.Counter
	connectionsCap            prometheus.Gauge
	dnsOverloaded             *prometheus.CounterVec
	panics                    *prometheus.CounterVec
}

func newMetrics() *metrics {
	dnsm := dnsserver.NewMetrics()
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_proxy_requests_total",
			Help: "Connection decisions (HTTP requests and CONNECT tunnels) by type, decision and reason code.",
		}, []string{"type", "decision", "reason"}),
		dnsQueries: dnsm.Queries,
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "compass_proxy_active_connections",
			Help: "Connections carrying traffic now: CONNECT tunnels, transparent tunnels and HTTP requests in flight.",
		}, []string{"type"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_proxy_bytes_total",
			Help: "Payload bytes relayed, by direction: upstream (client to destination) and downstream (destination to client).",
		}, []string{"direction"}),
		dialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "compass_proxy_dial_duration_seconds",
			Help:    "Time to open a TCP connection to a checked destination address.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "compass_proxy_policy_generation",
			Help: "Generation of the policy in force; it increases by one at every successful apply.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_proxy_policy_reloads_total",
			Help: "Policy apply attempts (admin PUT, SIGHUP, start-up) by result: success or failure.",
		}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "compass_proxy_config_last_reload_successful",
			Help: "1 if the last policy apply attempt succeeded, 0 if it was rejected (the previous policy stays in force).",
		}),
		swapClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_proxy_swap_closed_connections_total",
			Help: "Live connections closed because a new policy no longer allowed them.",
		}),
		connectionsCap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "compass_proxy_max_connections",
			Help: "The configured bound on concurrent client connections (0: unbounded).",
		}),
		dnsOverloaded: dnsm.Overloaded,
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_proxy_panics_total",
			Help: "Panics recovered while serving one connection or query, which was closed (or answered SERVFAIL), by component: front, tunnel, dns or resolver.",
		}, []string{"component"}),
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "compass_proxy_build_info",
		Help: "Always 1; the labels carry the binary's version and Go version.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(buildinfo.Version, runtime.Version()).Set(1)
	m.registry.MustRegister(m.requests, m.dnsQueries, m.active, m.bytes, m.dialDuration,
		m.generation, m.reloads, m.reloadOK, m.swapClosed, m.connectionsCap, m.dnsOverloaded, m.panics, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.activeHTTP, m.activeConnect = m.active.WithLabelValues(typeHTTP), m.active.WithLabelValues(typeConnect)
	m.activeTransparent = m.active.WithLabelValues(typeTransparent)
	m.bytesUp, m.bytesDown = m.bytes.WithLabelValues("upstream"), m.bytes.WithLabelValues("downstream")
	for _, c := range panicComponents {
		m.panics.WithLabelValues(c)
	}
	for _, r := range []string{"success", "failure"} {
		m.reloads.WithLabelValues(r)
	}
	return m
}

func decisionLabel(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}
