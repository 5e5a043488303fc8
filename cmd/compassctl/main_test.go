package main

import (
	"testing"

	"go.uber.org/goleak"
)

// The run command starts a signal goroutine (stopOnSignal) that must end with the command.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
