// Package procnet reads what the sidecar needs to know of its network namespace below
// /proc (or a test's copy of it): the gateways of its routes, which the proxy's guard
// refuses, and whether the namespace forwards packets, which makes the sidecar not
// ready.
package procnet
