package main

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// StreamResult says when the bytes of a long response arrived, and when the lines that
// arrived were sent: fakenet's /stream stamps each line with its send time
// ("line N sent_ms=T"), which tells a line sent after some moment from one merely read
// after it.
type StreamResult struct {
	Bytes        int    `json:"bytes"`
	FirstByteMS  int64  `json:"first_byte_unix_ms"`
	LastByteMS   int64  `json:"last_byte_unix_ms"`
	FirstSentMS  int64  `json:"first_sent_unix_ms,omitempty"`
	LastSentMS   int64  `json:"last_sent_unix_ms,omitempty"`
	EndedMS      int64  `json:"ended_unix_ms"`
	Error        string `json:"error,omitempty"`
	ClosedByPeer bool   `json:"closed_by_peer"`
}

// sentStamp is the send time a stamped line carries, if it is one.
func sentStamp(line string) (int64, bool) {
	_, v, ok := strings.Cut(line, " sent_ms=")
	if !ok || !strings.HasPrefix(line, "line ") {
		return 0, false
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return ms, err == nil
}

// stream reads an http:// URL (directly, or through an HTTP proxy) for a number of
// seconds and reports when data stopped arriving. With a READY file it creates that
// file once the first stamped line has arrived, so that a test can wait for the stream
// to flow rather than guess how long that takes.
func stream(args []string) StreamResult {
	u, dial, seconds, ready, err := streamArgs(args)
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
	for {
		line, err := br.ReadString('\n')
		now := time.Now().UnixMilli()
		if n := len(line); n > 0 {
			if r.Bytes == 0 {
				r.FirstByteMS = now
			}
			r.Bytes += n
			r.LastByteMS = now
		}
		if sent, ok := sentStamp(line); ok && err == nil {
			if r.FirstSentMS == 0 {
				r.FirstSentMS = sent
				if ready != "" {
					if werr := os.WriteFile(ready, nil, 0o644); werr != nil {
						r.Error = werr.Error()
						return r
					}
				}
			}
			r.LastSentMS = sent
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

// streamArgs reads `stream URL [PROXY] [SECONDS] [READY]`: the URL (http:// with a host:
// the probe speaks plain HTTP), the address to dial (the proxy when given and not empty,
// else the URL's host at its port or 80), how long to read (SECONDS, a positive whole
// number; 10 when absent) and the file to create once the stream flows.
func streamArgs(args []string) (u *url.URL, dial string, seconds int, ready string, err error) {
	u, err = url.Parse(args[0])
	if err != nil {
		return nil, "", 0, "", err
	}
	if u.Scheme != "http" || u.Hostname() == "" {
		return nil, "", 0, "", fmt.Errorf("probe: URL %q: want http://HOST[:PORT]/PATH", args[0])
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
			return nil, "", 0, "", fmt.Errorf("probe: SECONDS %q: want a positive whole number", args[2])
		}
	}
	if len(args) > 3 {
		ready = args[3]
	}
	return u, dial, seconds, ready, nil
}
