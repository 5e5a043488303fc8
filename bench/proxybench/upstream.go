package proxybench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// The stream upstream speaks a one-byte protocol so that one listener serves every
// tunnel measurement: the client's first byte picks what the upstream does.
const (
	modeBulk = 'b' // send bulkChunk repeatedly until the client goes away
	modeEcho = 'e' // send the byte back, then close
	modeIdle = 'i' // send the byte back, then hold the connection open and silent
)

const bulkChunk = 64 << 10

// Upstream is the local server the benchmark dials, directly or through a proxy: a
// stream listener for tunnels and a minimal HTTP/1.1 keep-alive server for forward
// requests. Both are deliberately cheap so that the proxy, not the upstream, is what
// the numbers measure.
type Upstream struct {
	stream net.Listener
	http   net.Listener

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartUpstream listens on two loopback ports and serves until Close.
func StartUpstream() (*Upstream, error) {
	return startUpstream(func() (net.Listener, error) { return listenUpstream("127.0.0.1") })
}

// startUpstream serves on two listeners that listen opens.
func startUpstream(listen func() (net.Listener, error)) (*Upstream, error) {
	stream, err := listen()
	if err != nil {
		return nil, fmt.Errorf("proxybench: upstream: %w", err)
	}
	httpLn, err := listen()
	if err != nil {
		stream.Close()
		return nil, fmt.Errorf("proxybench: upstream: %w", err)
	}
	u := &Upstream{stream: stream, http: httpLn, conns: map[net.Conn]struct{}{}}
	u.wg.Add(2)
	go u.accept(stream, serveStream)
	go u.accept(httpLn, serveHTTP)
	return u, nil
}

// StreamAddr is the host:port of the tunnel upstream.
func (u *Upstream) StreamAddr() string { return u.stream.Addr().String() }

// HTTPAddr is the host:port of the HTTP upstream.
func (u *Upstream) HTTPAddr() string { return u.http.Addr().String() }

// Close stops both listeners and every open connection, and waits for their handlers.
func (u *Upstream) Close() {
	u.stream.Close()
	u.http.Close()
	u.mu.Lock()
	for c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

func (u *Upstream) accept(ln net.Listener, serve func(net.Conn)) {
	defer u.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		u.mu.Lock()
		u.conns[c] = struct{}{}
		u.wg.Add(1)
		u.mu.Unlock()
		go func() {
			defer u.wg.Done()
			serve(c)
			c.Close()
			u.mu.Lock()
			delete(u.conns, c)
			u.mu.Unlock()
		}()
	}
}

func serveStream(c net.Conn) {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	switch b[0] {
	case modeBulk:
		chunk := make([]byte, bulkChunk)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	case modeEcho:
		// The upstream closes first, so the TIME_WAIT state of the thousands of short
		// connections stays on its side. Were it on the dialling side (the client or the
		// proxy), those sockets would hold the ephemeral ports towards this one address
		// and connect() would slow down, then fail, within a minute of set-ups.
		c.Write(b[:])
	case modeIdle:
		if _, err := c.Write(b[:]); err != nil {
			return
		}
		// Hold the tunnel until the client closes it.
		io.Copy(io.Discard, c)
	}
}

// httpResponse is the one answer of the HTTP upstream: small, with a length, keep-alive.
var httpResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 64\r\n\r\n" +
	"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")

// serveHTTP answers every request on the connection with httpResponse, and closes the
// connection after a request that asks for it (tinyproxy's do). Requests are GETs without
// bodies, so a request ends at its blank line.
func serveHTTP(c net.Conn) {
	r := bufio.NewReaderSize(c, 4096)
	for {
		closeAfter, err := readRequestHeader(r)
		if err != nil {
			return
		}
		if _, err := c.Write(httpResponse); err != nil || closeAfter {
			return
		}
	}
}

// readRequestHeader consumes one request header block up to its blank line and reports
// whether it carries "Connection: close".
func readRequestHeader(r *bufio.Reader) (closeAfter bool, err error) {
	// skip: the line read is the request line, or the rest of a line longer than the
	// buffer; neither is a header to look at nor the blank line that ends the block.
	skip := true
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			skip = true
			continue
		}
		if err != nil {
			return false, err
		}
		if skip {
			skip = false
			continue
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return closeAfter, nil
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok &&
			bytes.EqualFold(bytes.TrimSpace(name), []byte("Connection")) &&
			bytes.EqualFold(bytes.TrimSpace(value), []byte("close")) {
			closeAfter = true
		}
	}
}

// listenUpstream binds a listener of the upstream on a free port of host as plain TCP
// without keep-alive, as dialer dials: the upstream shares the two CPUs with the
// proxies, so what it spends per connection is taken from them.
func listenUpstream(host string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	lc.SetMultipathTCP(false)
	return lc.Listen(context.Background(), "tcp", net.JoinHostPort(host, "0"))
}
