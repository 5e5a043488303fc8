package docker

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
)

// TestExecOutput: a command's output is kept up to maxExecOutput per stream, with a line
// saying how much more there was (an agent printing without end must not exhaust the
// controller), and a command cut by its context still hands back what it printed, for
// the step log of a timed-out rollout.
func TestExecOutput(t *testing.T) {
	over := append(bytes.Repeat([]byte("x"), maxExecOutput), "the rest"...)
	tests := []struct {
		name    string
		stdout  []byte
		hang    bool
		want    string // prefix of the stdout kept
		note    string // the line appended after it, if any
		wantErr error
	}{
		{"short", []byte("hello\n"), false, "hello\n", "", nil},
		{"too long", over, false, string(over[:maxExecOutput]), "\n[compass-egress: 8 more bytes of output not kept]\n", nil},
		{"cut", []byte("got this far\n"), true, "got this far\n", "", context.Canceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeDocker(&events{})
			fake.execStdout, fake.execHang, fake.execPrinted = tc.stdout, tc.hang, make(chan struct{})
			e := &Env{p: &Provider{api: fake}, agentRef: "agent"}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var res controller.ExecResult
			var err error
			if tc.hang {
				done := make(chan struct{})
				go func() {
					defer close(done)
					res, err = e.Exec(ctx, []string{"agent"}, controller.ExecOptions{})
				}()
				<-fake.execPrinted // the command has printed; then Ctrl-C
				cancel()
				<-done
			} else {
				res, err = e.Exec(ctx, []string{"agent"}, controller.ExecOptions{})
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got := string(res.Stdout); got != tc.want+tc.note {
				t.Errorf("stdout: %d bytes ending %q, want %d bytes ending %q", len(got), tail(got), len(tc.want+tc.note), tail(tc.want+tc.note))
			}
		})
	}
}

func tail(s string) string { return s[max(0, len(s)-60):] }
