package main

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// StreamResult says when the bytes of a long response arrived.
type StreamResult struct {
	Bytes        int    `json:"bytes"`
	FirstByteMS  int64  `json:"first_byte_unix_ms"`
	LastByteMS   int64  `json:"last_byte_unix_ms"`
	EndedMS      int64  `json:"ended_unix_ms"`
	Error        string `json:"error,omitempty"`
	ClosedByPeer bool   `json:"closed_by_peer"`
}

// stream reads an http:// URL (directly, or through an HTTP proxy) for a number of
// seconds and reports when data stopped arriving.
func stream(args []string) StreamResult {
	u, dial, seconds, err := streamArgs(args)
	if err != nil {
		return StreamResult{Error: err.Error()}
	}
	var r StreamResult
	conn, err := net.DialTimeout("tcp", dial, 3*time.Second)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer conn.Close()
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	_ = conn.SetDeadline(end)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.String(), u.Host)
	br := bufio.NewReader(conn)
	buf := make([]byte, 256)
	for {
		n, err := br.Read(buf)
		now := time.Now().UnixMilli()
		if n > 0 {
			if r.Bytes == 0 {
				r.FirstByteMS = now
			}
			r.Bytes += n
			r.LastByteMS = now
		}
		if err != nil {
			r.EndedMS = now
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				r.ClosedByPeer = true
				r.Error = err.Error()
			}
			return r
		}
	}
}

// streamArgs reads `stream URL [PROXY] [SECONDS]`: the URL (http:// with a host: the
// probe speaks plain HTTP), the address to dial (the proxy when given and not empty,
// else the URL's host at its port or 80) and how long to read (SECONDS, a positive
// whole number; 10 when absent).
func streamArgs(args []string) (u *url.URL, dial string, seconds int, err error) {
	u, err = url.Parse(args[0])
	if err != nil {
		return nil, "", 0, err
	}
	if u.Scheme != "http" || u.Hostname() == "" {
		return nil, "", 0, fmt.Errorf("probe: URL %q: want http://HOST[:PORT]/PATH", args[0])
	}
	dial = u.Host
	if u.Port() == "" {
		dial = net.JoinHostPort(u.Hostname(), "80")
	}
	if len(args) > 1 && args[1] != "" {
		dial = args[1]
	}
	seconds = 10
	if len(args) > 2 {
		if seconds, err = strconv.Atoi(args[2]); err != nil || seconds <= 0 {
			return nil, "", 0, fmt.Errorf("probe: SECONDS %q: want a positive whole number", args[2])
		}
	}
	return u, dial, seconds, nil
}
