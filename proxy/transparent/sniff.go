package transparent

import (
	"errors"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/proxy/tlshello"
)

// sniff reads what decides c: it waits up to SniffWait for the first bytes and looks
// at them in place; a TLS record start has its ClientHello read off the socket, under
// HelloTimeout. An error is a client that left (or Close): nothing to serve.
func (l *Listener) sniff(c *Conn) error {
	deadline := time.Now().Add(l.cfg.SniffWait)
	_ = c.SetReadDeadline(deadline)
	proto, err := classify(c.TCPConn, deadline)
	if err != nil {
		return err
	}
	c.Protocol = proto
	if proto == TLS {
		_ = c.SetReadDeadline(time.Now().Add(l.cfg.HelloTimeout))
		c.Hello, c.ServerName, c.ECH, c.HelloErr = readHello(c.TCPConn)
		if errors.Is(c.HelloErr, net.ErrClosed) || l.closed.Load() {
			return net.ErrClosed
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	return nil
}

// peekLen is how many first bytes classify looks at: the longest method it knows and
// its space.
const peekLen = 8

// classify looks at the first bytes c's client sent (left in the socket) until they
// tell TLS, HTTP or TCP, or deadline passes: nothing by then is TCP, and so is a
// method-like prefix that never ends in a space.
func classify(c *net.TCPConn, deadline time.Time) (string, error) {
	var buf [peekLen]byte
	for {
		n, err := peek(c, buf[:])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return TCP, nil
		}
		if err != nil {
			return "", err
		}
		p := buf[:n]
		if tlshello.StartsRecord(p[0]) {
			return TLS, nil
		}
		switch methodPrefix(p) {
		case isMethod:
			return HTTP, nil
		case notMethod:
			return TCP, nil
		}
		// A prefix of a method: more may follow. What has arrived stays readable, so
		// the wait for more is a short poll, bounded by the deadline.
		if !time.Now().Before(deadline) {
			return TCP, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// methods are the request methods (RFC 9110 §9, PATCH) that make a connection HTTP.
// A protocol whose client speaks a word and a space first (SMTP's EHLO, Redis's inline
// SET) is not one of them; an HTTP request with another method is read as TCP.
var methods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "CONNECT"}

// The outcomes of methodPrefix.
const (
	notMethod = iota
	maybeMethod
	isMethod
)

// methodPrefix says whether p starts with a known method and a space, could still, or
// cannot.
func methodPrefix(p []byte) int {
	maybe := false
	for _, m := range methods {
		switch {
		case len(p) > len(m) && string(p[:len(m)]) == m && p[len(m)] == ' ':
			return isMethod
		case len(p) <= len(m) && string(p) == m[:len(p)]:
			maybe = true
		}
	}
	if maybe {
		return maybeMethod
	}
	return notMethod
}

// peek copies the bytes waiting in c into buf without reading them off (MSG_PEEK),
// waiting (under c's read deadline) until there is at least one. io.EOF: the client
// closed without sending any.
func peek(c *net.TCPConn, buf []byte) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return !errors.Is(rerr, unix.EAGAIN) && !errors.Is(rerr, unix.EINTR)
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// readHello reads c's ClientHello off the socket: the bytes read, the server name,
// whether it carries ECH, and why it could not be read whole.
func readHello(c *net.TCPConn) (hello []byte, name string, ech bool, err error) {
	var parse tlshello.Parser
	buf := make([]byte, 0, 2048)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, len(buf))...)[:len(buf)]
		}
		n, rerr := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			name, more, perr := parse.Read(buf)
			switch {
			case perr != nil:
				return buf, "", false, perr
			case !more:
				return buf, name, parse.ECH(), nil
			case len(buf) > tlshello.MaxStream:
				return buf, "", false, tlshello.ErrMalformed
			}
		}
		if rerr != nil {
			return buf, "", false, rerr
		}
	}
}
