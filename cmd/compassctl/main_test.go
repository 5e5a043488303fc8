package main

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// TestMain points DOCKER_HOST at a socket nothing listens on, for every test of the
// package: these are unit tests, and a command whose input checks let it through must
// fail at the engine, not act on the machine's (an open got as far as creating the
// default egress network there once). The run command starts a signal goroutine
// (stopOnSignal) that must end with the command.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "compassctl-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "no-engine.sock"))
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}
