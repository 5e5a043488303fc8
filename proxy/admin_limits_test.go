package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/adminapi"
)

// A PUT body over adminapi.MaxPolicyBody is answered 413 naming the limit, whether its length
// is declared or it comes chunked, and the running policy stays; one of exactly the
// limit is read whole. Each refusal counts as a failed reload.
func TestPolicyBodyLimit(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		name string
		req  func(c net.Conn)
		want int
	}{
		// Declared too long and never sent: refused before the body is read.
		{"declared", func(c net.Conn) {
			fmt.Fprintf(c, "PUT /v1/policy HTTP/1.1\r\nHost: admin\r\nContent-Length: %d\r\n\r\n", adminapi.MaxPolicyBody+1)
		}, http.StatusRequestEntityTooLarge},
		// A reader of unknown length goes chunked: the bound must hold while reading.
		{"chunked", func(c net.Conn) {
			req, _ := http.NewRequest("PUT", "http://admin/v1/policy", io.MultiReader(strings.NewReader(strings.Repeat(" ", adminapi.MaxPolicyBody+1))))
			_ = req.Write(c)
		}, http.StatusRequestEntityTooLarge},
		// Read whole, and refused for what it says (which fails at its first byte: a
		// valid policy of 32 MiB takes seconds to decode under the race detector).
		{"at the limit", func(c net.Conn) {
			req, _ := http.NewRequest("PUT", "http://admin/v1/policy", strings.NewReader("x"+strings.Repeat(" ", adminapi.MaxPolicyBody-1)))
			_ = req.Write(c)
		}, http.StatusBadRequest},
		// A body that breaks off is refused, even when what came before the break is a
		// valid policy by itself.
		{"broken chunking", func(c net.Conn) {
			fmt.Fprint(c, "PUT /v1/policy HTTP/1.1\r\nHost: admin\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n\"public\"\r\nzz\r\n")
		}, http.StatusBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Every refusal counts as a failed reload, after a success here.
			h.apply(`"public"`)
			failures := testutil.ToFloat64(h.srv.metrics.reloads.WithLabelValues("failure"))
			before := h.srv.Current()
			c, err := net.Dial("unix", h.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			// The request is written beside the read: a server that answers early stops
			// reading, and the write then fails or blocks.
			go tc.req(c)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
			if h.srv.Current() != before {
				t.Errorf("a refused body changed the rule set")
			}
			if got := testutil.ToFloat64(h.srv.metrics.reloads.WithLabelValues("failure")); got != failures+1 {
				t.Errorf("reloads_total{failure} went from %v to %v, want one more", failures, got)
			}
			if got := testutil.ToFloat64(h.srv.metrics.reloadOK); got != 0 {
				t.Errorf("last_reload_successful %v after a refusal, want 0", got)
			}
			if tc.want != http.StatusRequestEntityTooLarge {
				return
			}
			if !strings.Contains(string(body), fmt.Sprint(adminapi.MaxPolicyBody)) || !strings.Contains(string(body), "unchanged") {
				t.Errorf("answer does not name the limit: %s", body)
			}
		})
	}
}

// The admin socket's server ends a request whose body stalls (ReadTimeout) and a
// keep-alive connection that stays idle (IdleTimeout): each held a goroutine, and a
// stalled body what it had sent, for as long as the client liked. Only the time of the
// close tells the timeout tuned here (200 ms) from the server's defaults (30 s, 1 min)
// that would otherwise end the connection: the bound between them, cutBy, is 50 times
// the first, which no plausible slowness reaches, and a third of the second.
func TestAdminServerTimeouts(t *testing.T) {
	const cutBy = 10 * time.Second
	cases := []struct {
		name string
		tune func(*Config)
		send string
	}{
		{"stalled body", func(c *Config) { c.controlReadTimeout = 200 * time.Millisecond },
			"PUT /v1/policy HTTP/1.1\r\nHost: admin\r\nContent-Length: 100\r\n\r\n\"public\""},
		{"idle keep-alive", func(c *Config) { c.controlIdleTimeout = 200 * time.Millisecond },
			"GET /livez HTTP/1.1\r\nHost: admin\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.tune)
			c, err := net.Dial("unix", h.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(cutBy))
			if _, err := io.WriteString(c, tc.send); err != nil {
				t.Fatal(err)
			}
			// Whatever the server answers, it must then close the connection.
			if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the connection is still open after %v", cutBy)
			}
		})
	}
}
