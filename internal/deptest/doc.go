// Package deptest holds the module's dependency rules, checked by its test against the
// import graph `go list` reports: the controller does not link the sidecar, the sidecar
// does not link the controller or Docker, and the net/ packages need the standard
// library only. A rule broken names the import chain that broke it.
package deptest
