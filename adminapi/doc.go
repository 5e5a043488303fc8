// Package adminapi is the sidecar's admin API, the one definition both of its ends
// use: the paths compass-proxy serves on its unix socket, the JSON it takes and
// answers (policy status, swap result, blocked-attempt summary, error body), the
// limits it enforces on what it takes, and the client the controller and
// `compass-proxy healthcheck` talk to it with.
//
// It is a leaf: it imports the standard library and policy, never the sidecar or the
// controller, so that both can import it.
package adminapi
