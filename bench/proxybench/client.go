package proxybench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// Target is one thing the benchmark measures: direct connections to the upstream, or a
// proxy in front of it.
type Target struct {
	Name string
	// Proxy is the proxy's host:port; empty for direct connections.
	Proxy string
	// PIDs lists the processes whose memory is the proxy's (nil for direct).
	PIDs func() []int
	// Enter runs fn on a thread in the client's network namespace, so that the
	// connections fn opens start there; nil runs it here, in the benchmark's.
	Enter func(fn func() error) error
	// Upstream is the upstream this target reaches; nil: the run's, on loopback.
	Upstream *Upstream
}

// Direct reports whether the client speaks to the destination itself, with no proxy
// protocol: direct connections, or a transparent proxy the kernel redirects them to.
func (t Target) Direct() bool { return t.Proxy == "" }

// run calls fn in the target's client namespace (see Enter).
func (t Target) run(fn func() error) error {
	if t.Enter == nil {
		return fn()
	}
	return t.Enter(fn)
}

const ioTimeout = 10 * time.Second

// dialer opens every connection of the load generator. Keep-alive is off: its four
// setsockopt calls per connection took 8% of the load generator's CPU in the set-ups
// measurement (perf), CPU the proxies on the same two CPUs then lacked, and the
// connections live for milliseconds.
var dialer = net.Dialer{Timeout: ioTimeout, KeepAlive: -1}

// dialTunnel opens a connection to dest: a plain TCP connection for a direct target, a
// CONNECT tunnel through the proxy otherwise. The returned reader holds any bytes the
// proxy sent after its response header.
func dialTunnel(t Target, dest string) (net.Conn, *bufio.Reader, error) {
	if t.Direct() {
		c, err := dialer.Dial("tcp", dest)
		if err != nil {
			return nil, nil, err
		}
		return c, bufio.NewReaderSize(c, 1024), nil
	}
	c, err := dialer.Dial("tcp", t.Proxy)
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(c, "CONNECT "+dest+" HTTP/1.1\r\nHost: "+dest+"\r\n\r\n"); err != nil {
		c.Close()
		return nil, nil, err
	}
	r := bufio.NewReaderSize(c, 1024)
	h, err := readHeader(r)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("CONNECT %s: %w", dest, err)
	}
	if h.status != 200 {
		c.Close()
		return nil, nil, fmt.Errorf("CONNECT %s: status %d", dest, h.status)
	}
	c.SetDeadline(time.Time{})
	return c, r, nil
}

// respHeader is what the benchmark needs of an HTTP/1.x response header.
type respHeader struct {
	status int
	length int64 // Content-Length; -1 when absent
	close  bool  // the server will close the connection after this response
}

// readHeader reads an HTTP/1.x response header.
func readHeader(r *bufio.Reader) (respHeader, error) {
	h := respHeader{length: -1}
	line, err := r.ReadSlice('\n')
	if err != nil {
		return h, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return h, fmt.Errorf("bad status line %q", line)
	}
	h.close = line[7] == '0' // HTTP/1.0 closes unless it says keep-alive
	if h.status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return h, fmt.Errorf("bad status line %q", line)
	}
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return h, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return h, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		name, value = bytes.TrimSpace(name), bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if h.length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return h, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Connection")), bytes.EqualFold(name, []byte("Proxy-Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				h.close = true
			} else if bytes.EqualFold(value, []byte("keep-alive")) {
				h.close = false
			}
		}
	}
}

// httpConn is one client that sends GETs for one URL, through a proxy (absolute-URI
// form) or directly (origin form), on a keep-alive connection. When the server closes
// the connection after a response (tinyproxy does after each one), the next request
// opens a new one, as any client would.
type httpConn struct {
	addr string
	req  []byte
	c    net.Conn
	r    *bufio.Reader
}

func newHTTPConn(t Target, upstream string) *httpConn {
	addr, target := upstream, "/bench"
	if !t.Direct() {
		addr, target = t.Proxy, "http://"+upstream+"/bench"
	}
	req := "GET " + target + " HTTP/1.1\r\nHost: " + upstream + "\r\nUser-Agent: proxybench\r\nAccept: */*\r\n\r\n"
	return &httpConn{addr: addr, req: []byte(req)}
}

// get sends one request and reads its whole response. Like any HTTP client, it retries
// once on a new connection when a reused one turns out to have been closed by the server
// before answering (tinyproxy closes after each response without saying so). After an
// error the connection is closed; the next get opens a new one.
func (h *httpConn) get() error {
	reused := h.c != nil
	err := h.roundTrip()
	if err != nil && reused && errors.Is(err, errNoResponse) {
		h.Close()
		err = h.roundTrip()
	}
	if err != nil {
		h.Close()
	}
	return err
}

// errNoResponse marks a connection that ended before the first byte of a response.
var errNoResponse = errors.New("connection closed before a response")

func (h *httpConn) roundTrip() error {
	if h.c == nil {
		c, err := dialer.Dial("tcp", h.addr)
		if err != nil {
			return err
		}
		h.c, h.r = c, bufio.NewReaderSize(c, 4096)
	}
	h.c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := h.c.Write(h.req); err != nil {
		return fmt.Errorf("%w: %w", errNoResponse, err)
	}
	if _, err := h.r.Peek(1); err != nil {
		return fmt.Errorf("%w: %w", errNoResponse, err)
	}
	resp, err := readHeader(h.r)
	if err != nil {
		return err
	}
	if resp.status != 200 {
		return fmt.Errorf("GET: status %d", resp.status)
	}
	if resp.length < 0 {
		return fmt.Errorf("GET: response without Content-Length")
	}
	if _, err := h.r.Discard(int(resp.length)); err != nil {
		return err
	}
	if resp.close {
		h.Close()
	}
	return nil
}

// Close closes the current connection, if any.
func (h *httpConn) Close() {
	if h.c != nil {
		h.c.Close()
		h.c, h.r = nil, nil
	}
}
