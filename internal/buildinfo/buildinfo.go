// Package buildinfo carries the version stamped into binaries at link time.
package buildinfo

// Version is set with -ldflags "-X .../internal/buildinfo.Version=..." by the Makefile.
var Version = "dev"
