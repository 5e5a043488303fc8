// Package tcptest serves raw TCP on loopback for tests: the upstreams the proxy and its
// upstream client talk to when net/http's server would rewrite what they send.
package tcptest

import (
	"bufio"
	"net"
	"sync"
	"testing"
)

// Serve listens on ip and runs handle for each connection on a goroutine of its own,
// closing the connection when handle returns. done closes when the test ends; the
// cleanup then closes the listener and every connection still open, and waits for the
// handlers.
func Serve(t testing.TB, ip string, handle func(c net.Conn, done <-chan struct{})) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
		done  = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c, done)
			}()
		}
	}()
	t.Cleanup(func() {
		close(done)
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr)
}

// ReadHead reads one request head.
func ReadHead(br *bufio.Reader) error {
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if l == "\r\n" {
			return nil
		}
	}
}
