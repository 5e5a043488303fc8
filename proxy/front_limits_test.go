package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/proxy/httpfront"
)

// TestRefusedConnectClosesItsConnection: after the answer to a refused CONNECT the
// front ends its side, reads what the client still sends for a bounded time, and then
// closes the connection. A close with the client's bytes unread makes the kernel send
// a reset, which can destroy the answer before the client reads it; a read without a
// bound (a CONNECT reads its client with no deadline) lets a client that stays hold
// the connection, its worker and its slot for as long as it likes.
func TestRefusedConnectClosesItsConnection(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	refused := h.b.echoHostPort("b.test")
	head := fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", refused, refused)

	t.Run("client sends on, then half-closes", func(t *testing.T) {
		c := h.dialProxy(t)
		sent := make(chan error, 1)
		go func() {
			// Far beyond what the front buffers, within what it drains.
			_, err := io.WriteString(c, head+strings.Repeat("x", 64<<10))
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			sent <- err
		}()
		got, err := io.ReadAll(c)
		if !strings.HasPrefix(string(got), "HTTP/1.1 403 ") || err != nil {
			t.Errorf("the client read %q, %v; want the 403 and a clean close, not a reset", firstLine(string(got)), err)
		}
		if err := <-sent; err != nil {
			t.Errorf("the client's bytes after the CONNECT: %v", err)
		}
	})

	t.Run("client stays", func(t *testing.T) {
		c := h.dialProxy(t)
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c) // until the front ends its side
		if !strings.HasPrefix(string(got), "HTTP/1.1 403 ") || err != nil {
			t.Fatalf("the client read %q, %v; want the 403 and the end of the front's side", firstLine(string(got)), err)
		}
		// Once the front has closed its socket, a byte the client sends is answered with
		// a reset, and a later write fails; a front that still reads takes them all.
		waitFor(t, func() bool {
			_, err := io.WriteString(c, "x")
			return err != nil
		})
		waitFor(t, func() bool {
			return h.srv.front.Conns() == 0
		})
	})
}

// TestConnectHeadFieldBoundIsExact: a head of httpfront.MaxHeadFields field lines is read, one
// of a line more gets 431, whatever the request (here a CONNECT, refused by policy).
func TestConnectHeadFieldBoundIsExact(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	refused := h.b.echoHostPort("b.test")
	for _, tc := range []struct {
		fields int // Host included
		want   string
	}{
		{httpfront.MaxHeadFields, "HTTP/1.1 403 "},
		{httpfront.MaxHeadFields + 1, "HTTP/1.1 431 "},
	} {
		out := h.raw(fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", refused, refused, headFieldLines(tc.fields-1)))
		if !strings.HasPrefix(out, tc.want) {
			t.Errorf("%d fields: answer %q, want %q", tc.fields, firstLine(out), tc.want)
		}
	}
}

// TestNextHeadIsBoundedByTheHeaderTimeout: on a kept connection, the wait for the next
// request is bounded by the idle timeout, but once its first byte has come the head is
// bounded by the header timeout, as a connection's first head is: a client that
// trickles heads cannot hold its connection for the idle timeout each.
func TestNextHeadIsBoundedByTheHeaderTimeout(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.HeaderTimeout = 200 * time.Millisecond
		c.IdleTimeout = time.Hour
	})
	h.apply(`"public"`)
	c, br := keepAliveGET(t, h)
	if _, err := io.WriteString(c, "GET http://a.te"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if rest, err := io.ReadAll(br); err != nil {
		t.Fatalf("a half-sent second head: read %q, %v; want the connection closed after the header timeout", rest, err)
	}
}

// TestDrainDeadlineClosesAConnectionStuckInAnAnswer: at the drain's deadline the front
// closes the connections still open, not only ends their requests: ending the request
// does not end a write of its answer to a client that reads nothing, which only the
// connection's close (or the tunnel idle timeout, 15 minutes) ends.
func TestDrainDeadlineClosesAConnectionStuckInAnAnswer(t *testing.T) {
	stalled := make(chan struct{})
	up := serveTCP(t, "127.0.0.2", func(c net.Conn, done <-chan struct{}) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n")
		writeUntilStalled(c, stalled)
		<-done
	})
	h := newHarness(t)
	h.apply(`"public"`)
	c := h.dialProxy(t)
	fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", up, up)
	select {
	case <-stalled:
	case <-time.After(hangGuard):
		t.Fatal("the upstream's writes never stalled")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- h.srv.Shutdown(ctx) }()
	select {
	case <-shut:
	case <-time.After(hangGuard):
		c.Close() // ends the write, so that Shutdown and the test end
		<-shut
		t.Fatalf("Shutdown still waited %v after its deadline for a client that reads nothing", hangGuard)
	}
}
