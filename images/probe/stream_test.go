package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStreamArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		dial    string
		seconds int
		err     string
	}{
		{"host and port 80 by default", []string{"http://stream.test/stream"}, "stream.test:80", 10, ""},
		{"port of the URL", []string{"http://stream.test:8080/s"}, "stream.test:8080", 10, ""},
		{"IPv6 host", []string{"http://[::1]/s"}, "[::1]:80", 10, ""},
		{"proxy", []string{"http://stream.test/s", "127.0.0.1:3128"}, "127.0.0.1:3128", 10, ""},
		{"empty proxy is direct", []string{"http://stream.test/s", "", "8"}, "stream.test:80", 8, ""},
		{"ready file", []string{"http://stream.test/s", "", "8", "/ready"}, "stream.test:80", 8, ""},
		{"seconds not a number", []string{"http://stream.test/s", "", "soon"}, "", 0, `SECONDS "soon": want a positive whole number`},
		{"seconds not positive", []string{"http://stream.test/s", "", "0"}, "", 0, `SECONDS "0": want a positive whole number`},
		{"bad URL", []string{"http://stream.test:port/"}, "", 0, `invalid port ":port"`},
		{"no scheme", []string{"stream.test/stream"}, "", 0, `URL "stream.test/stream": want http://HOST[:PORT]/PATH`},
		{"https", []string{"https://stream.test/stream"}, "", 0, `URL "https://stream.test/stream": want http://`},
		{"no host", []string{"http:///stream"}, "", 0, `URL "http:///stream": want http://`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, dial, seconds, ready, err := streamArgs(tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %q", err, tc.err)
				}
				return
			}
			wantReady := ""
			if len(tc.args) > 3 {
				wantReady = tc.args[3]
			}
			if err != nil || u.String() != tc.args[0] || dial != tc.dial || seconds != tc.seconds || ready != wantReady {
				t.Errorf("got %v %q %d %q %v, want %s %q %d %q", u, dial, seconds, ready, err, tc.args[0], tc.dial, tc.seconds, wantReady)
			}
		})
	}
}

// FuzzStreamArgs: stream takes only http:// URLs with a host, dials the proxy when one
// is given, else the URL's own host and port (80 when it has none), and reads for
// SECONDS, which must be a positive number.
func FuzzStreamArgs(f *testing.F) {
	f.Add("http://stream.test/stream", "", "8")
	f.Add("http://[::1]:8080/s", "127.0.0.1:3128", "x")
	f.Add("http://a.test:/", "", "-1")
	f.Fuzz(func(t *testing.T, rawURL, proxy, secs string) {
		u, dial, seconds, _, err := streamArgs([]string{rawURL, proxy, secs})
		if err != nil {
			return
		}
		if u.Scheme != "http" || u.Hostname() == "" {
			t.Errorf("URL %q taken", rawURL)
		}
		if proxy != "" {
			if dial != proxy {
				t.Errorf("dial %q, want the proxy %q", dial, proxy)
			}
		} else {
			// url.Parse takes hosts a dial refuses (such as "]"): those fail to dial.
			if host, port, err := net.SplitHostPort(dial); err == nil {
				want := u.Port()
				if want == "" {
					want = "80"
				}
				if host != u.Hostname() || port != want {
					t.Errorf("URL %q: dial %q, want host %q port %q", rawURL, dial, u.Hostname(), want)
				}
			}
		}
		if want, err := strconv.Atoi(secs); err != nil || want <= 0 || seconds != want {
			t.Errorf("SECONDS %q taken as %d", secs, seconds)
		}
	})
}

// serveHTTP answers each loopback connection with write after reading the request's
// head, which it passes on seen (when not nil).
func serveHTTP(t *testing.T, seen chan<- string, write func(net.Conn)) string {
	return serveConns(t, func(c net.Conn) {
		line, _, err := readRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		if seen != nil {
			seen <- line
		}
		write(c)
	})
}

const shortAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nline 0"

// lines sends a line every 50 ms until the client goes away, like fakenet's /stream.
func lines(c net.Conn) {
	fmt.Fprint(c, "HTTP/1.1 200 OK\r\n\r\n")
	for i := 0; ; i++ {
		if _, err := fmt.Fprintf(c, "line %d\n", i); err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStream: when the bytes came, and who ended the stream: the peer (closed) or the
// probe (SECONDS up). Who ended it is what the result says; time is asserted only as
// a lower bound (the probe read for SECONDS) and, for SECONDS, as an upper bound at the
// 10 s default, which a probe that ignored SECONDS would reach and one that obeys it
// (1 s) misses by 9 s, far more than a loaded machine plausibly adds.
func TestStream(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 1)
	closing := serveHTTP(t, nil, func(c net.Conn) { fmt.Fprint(c, shortAnswer) })
	flowing := serveHTTP(t, nil, lines)
	proxy := serveHTTP(t, seen, func(c net.Conn) { fmt.Fprint(c, shortAnswer) })
	const defaultSeconds = 10 * time.Second
	tests := []struct {
		name   string
		args   []string
		bytes  int // -1: some
		byPeer bool
		err    string
		min    time.Duration
		before time.Duration // 0: no upper bound
	}{
		{"closed by the peer", []string{"http://" + closing + "/stream"}, len(shortAnswer), true, "EOF", 0, 0},
		{"read until SECONDS are up", []string{"http://" + flowing + "/stream", "", "1"}, -1, false, "", 900 * time.Millisecond, defaultSeconds},
		{"through a proxy", []string{"http://stream.test/stream", proxy, "2"}, len(shortAnswer), true, "EOF", 0, 0},
		{"nothing listens", []string{"http://" + closedTCP(t) + "/stream"}, 0, false, "connection refused", 0, 0},
		{"bad URL", []string{"http://stream.test:port/"}, 0, false, "invalid port", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := stream(tc.args)
			took := time.Since(start)
			if took < tc.min {
				t.Errorf("took %v, want at least %v", took, tc.min)
			}
			if tc.before > 0 && took >= tc.before {
				t.Errorf("took %v, want less than the default %v (SECONDS ignored)", took, tc.before)
			}
			if (tc.bytes >= 0 && r.Bytes != tc.bytes) || (tc.bytes < 0 && r.Bytes == 0) || r.ClosedByPeer != tc.byPeer ||
				!strings.Contains(r.Error, tc.err) || (tc.err == "" && r.Error != "") {
				t.Errorf("got %+v, want bytes %d, closed by peer %v, error %q", r, tc.bytes, tc.byPeer, tc.err)
			}
			if r.Bytes > 0 && !(start.UnixMilli() <= r.FirstByteMS && r.FirstByteMS <= r.LastByteMS && r.LastByteMS <= r.EndedMS) {
				t.Errorf("times out of order (start %d): %+v", start.UnixMilli(), r)
			}
		})
	}
	// The proxy is asked for the absolute URL, with the origin's name: the probe does
	// not resolve it itself.
	if got, want := <-seen, "GET http://stream.test/stream Host=stream.test"; got != want {
		t.Errorf("proxy saw %q, want %q", got, want)
	}
}

// stampedLines sends fakenet's stamped lines ("line N sent_ms=T"), chunked as net/http
// sends them, until the client goes away.
func stampedLines(c net.Conn) {
	fmt.Fprint(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
	for i := 0; ; i++ {
		line := fmt.Sprintf("line %d sent_ms=%d\n", i, time.Now().UnixMilli())
		if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(line), line); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The send stamps of the lines that arrived are reported, and the READY file appears
// once the first one has: a test waits on the file, not on a guess of how long a
// stream takes to start.
func TestStreamSendStampsAndReady(t *testing.T) {
	t.Parallel()
	ready := t.TempDir() + "/ready"
	start := time.Now().UnixMilli()
	r := stream([]string{"http://" + serveHTTP(t, nil, stampedLines) + "/stream", "", "1", ready})
	if r.FirstSentMS < start || r.LastSentMS <= r.FirstSentMS || r.LastSentMS > r.LastByteMS {
		t.Errorf("send stamps out of order (start %d): %+v", start, r)
	}
	if _, err := os.Stat(ready); err != nil {
		t.Errorf("no READY file after the stream flowed: %v", err)
	}
	unstamped := t.TempDir() + "/ready"
	if r := stream([]string{"http://" + serveHTTP(t, nil, lines) + "/stream", "", "1", unstamped}); r.FirstSentMS != 0 || r.Bytes == 0 {
		t.Errorf("unstamped lines: %+v, want bytes and no stamps", r)
	}
	if _, err := os.Stat(unstamped); !os.IsNotExist(err) {
		t.Errorf("READY file without a stamped line (%v)", err)
	}
}
