package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSwapCutsNewlyDisallowedConnections: tunnels and in-flight requests the new policy
// no longer allows are closed before the swap returns; allowed ones keep working.
func TestSwapCutsNewlyDisallowedConnections(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	_, toA := h.connect(h.a.echoHostPort("a.test"), "")
	_, toB := h.connect(h.b.echoHostPort("b.test"), "")
	for _, c := range []*tunnelConn{toA, toB} {
		echoRoundTrip(t, c, "before")
	}
	// A streaming response from a.test, in flight.
	resp, err := h.client.Get(fmt.Sprintf("http://a.test:%d/stream", h.a.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stream := bufio.NewReader(resp.Body)
	if line, err := stream.ReadString('\n'); err != nil || line != "tick\n" {
		t.Fatalf("stream: %q %v", line, err)
	}

	res := h.apply(`{"network_mode":"allowlist","allowed_hosts":["b.test"]}`)
	if res.ClosedConnections != 2 {
		t.Fatalf("closed %d connections, want 2 (the a.test tunnel and stream)", res.ClosedConnections)
	}
	// Closed already: the next read ends at once, whatever was buffered before.
	_ = toA.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := io.ReadAll(toA); err != nil && errors.Is(err, errTimeout(err)) {
		t.Fatalf("a.test tunnel still open: %v", err)
	}
	_ = toA.SetReadDeadline(time.Time{})
	if err := drainStream(stream); err == nil {
		t.Fatal("a.test stream kept going after the swap")
	}
	echoRoundTrip(t, toB, "after")

	// public → no-network cuts everything, including the b.test tunnel.
	if res := h.apply(`"no-network"`); res.ClosedConnections != 1 {
		t.Fatalf("no-network closed %d, want 1", res.ClosedConnections)
	}
	_ = toB.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := io.ReadAll(toB); err != nil && errors.Is(err, errTimeout(err)) {
		t.Fatalf("b.test tunnel outlived no-network")
	}
	if n := h.srv.tracker.len(); n != 0 {
		t.Fatalf("%d connections still tracked", n)
	}
}

// errTimeout returns err itself when it is a timeout, so errors.Is matches only then.
func errTimeout(err error) error {
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		return err
	}
	return errors.New("not a timeout")
}

// drainStream reports whether the stream ended (an error) or still flowed after the
// hang guard (nil): the stream sends a tick every 20 ms as long as it lives.
func drainStream(r *bufio.Reader) error {
	deadline := time.After(hangGuard)
	errc := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		if err == nil {
			err = io.EOF
		}
		errc <- err
	}()
	select {
	case <-errc:
		return errors.New("ended")
	case <-deadline:
		return nil
	}
}

func echoRoundTrip(t *testing.T, c *tunnelConn, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo %q: got %q %v", msg, buf, err)
	}
}

// TestReloadUnderLoad: 200 connections run while the policy is swapped 100 times
// between policies that all allow them; none may fail.
func TestReloadUnderLoad(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Logger = discardLogger() })
	policies := []string{
		`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test"]}`,
		`{"network_mode":"allowlist","allowed_hosts":["*.test"]}`,
		`{"network_mode":"denylist","denied_hosts":["evil.test"]}`,
		`"public"`,
		`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/29"]}`,
	}
	h.apply(policies[0])
	const workers = 200
	var (
		wg       sync.WaitGroup
		failures atomic.Int64
		done     = make(chan struct{})
		firstErr atomic.Value
	)
	fail := func(err error) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	ready := make(chan struct{}, workers)
	var ops [workers]atomic.Int64 // round trips completed, per worker
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				// A long-lived tunnel, echoing throughout.
				resp, c := h.connect(h.a.echoHostPort("a.test"), "")
				if c == nil {
					fail(fmt.Errorf("CONNECT: %d %s", resp.StatusCode, resp.Header.Get("X-Compass-Egress")))
					ready <- struct{}{}
					return
				}
				defer c.Close()
				ready <- struct{}{}
				buf := make([]byte, 4)
				for n := 0; ; n++ {
					select {
					case <-done:
						return
					default:
					}
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					if _, err := io.WriteString(c, "ping"); err != nil {
						fail(err)
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						fail(err)
						return
					}
					ops[i].Add(1)
					time.Sleep(time.Millisecond)
				}
			}
			// Keep-alive HTTP requests.
			ready <- struct{}{}
			client := &http.Client{Transport: h.client.Transport.(*http.Transport).Clone(), Timeout: 10 * time.Second}
			defer client.CloseIdleConnections()
			for {
				select {
				case <-done:
					return
				default:
				}
				resp, err := client.Get(fmt.Sprintf("http://b.test:%d/", h.b.httpPort))
				if err != nil {
					fail(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					fail(fmt.Errorf("status %d", resp.StatusCode))
					return
				}
				ops[i].Add(1)
			}
		}()
	}
	for range workers {
		<-ready
	}
	var before [workers]int64
	for i := range workers {
		before[i] = ops[i].Load()
	}
	for i := range 100 {
		if res := h.apply(policies[i%len(policies)]); res.ClosedConnections != 0 {
			t.Errorf("swap %d closed %d allowed connections", i, res.ClosedConnections)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Every connection still carries traffic after the swaps: a swap that stalled
	// decisions or relays would fail nothing above.
	waitFor(t, func() bool {
		for i := range workers {
			if ops[i].Load() <= before[i] && failures.Load() == 0 {
				return false
			}
		}
		return true
	})
	close(done)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d connections failed across the swaps; first: %v", n, firstErr.Load())
	}
}

// TestApplyIsAtomicForDecisions races decisions against swaps: every decision must be
// the outcome of one of the two policies, never a mix.
func TestApplyRacesDecisions(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Logger = discardLogger() })
	h.apply(`"no-network"`)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			if i%2 == 0 {
				h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
			} else {
				h.apply(`"no-network"`)
			}
		}
	}()
	for range 200 {
		status, header := h.connectStatus(h.a.echoHostPort("a.test"))
		if status != 200 && header != "denied; reason=no-network" && header != "denied; reason="+ReasonPolicyChanged {
			t.Errorf("status %d header %q", status, header)
		}
	}
	cancel()
	wg.Wait()
	h.apply(`"no-network"`)
	if n := h.srv.tracker.len(); n != 0 {
		t.Fatalf("%d connections tracked under no-network", n)
	}
}
