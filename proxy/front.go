package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// front reads the first bytes of every client connection. A connection that opens with
// a CONNECT is served here as a tunnel, without net/http's server and goproxy: a tunnel
// needs neither, and their per-connection machinery was the largest share of the
// proxy's own CPU per tunnel set-up. Every other connection is handed, with the bytes
// read so far, to the HTTP server (goproxy), which serves plain HTTP and anything odd.
//
// front is also the listener that HTTP server accepts from.
type front struct {
	s       *Server
	handoff chan net.Conn
	done    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	reading map[net.Conn]struct{} // connections whose first request is being read
	wg      sync.WaitGroup        // their goroutines
}

func newFront(s *Server) *front {
	return &front{s: s, handoff: make(chan net.Conn), done: make(chan struct{}), reading: make(map[net.Conn]struct{})}
}

// maxHeadBytes bounds a CONNECT request's head, as the HTTP server's MaxHeaderBytes
// bounds the others (it allows 4 KiB of slack for its buffer; so does this).
const maxHeadBytes = 64<<10 + 4096

// frontReaders are the 4 KiB readers of request heads; a tunnel gives its back once
// the head is parsed.
var frontReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// serve accepts until the listener closes.
func (f *front) serve() error {
	for {
		c, err := f.s.proxyLn.Accept()
		if err != nil {
			f.Close()
			return err
		}
		f.mu.Lock()
		select {
		case <-f.done:
			f.mu.Unlock()
			c.Close()
			f.s.proxyLn.release()
			continue
		default:
		}
		f.reading[c] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		go f.serveConn(c)
	}
}

// Accept, Close and Addr make front the HTTP server's listener.
func (f *front) Accept() (net.Conn, error) {
	select {
	case c := <-f.handoff:
		return c, nil
	case <-f.done:
		return nil, net.ErrClosed
	}
}

// Close stops hand-offs and wakes every connection still being read, which then
// closes; it does not wait (see wait).
func (f *front) Close() error {
	f.once.Do(func() {
		f.mu.Lock()
		close(f.done)
		for c := range f.reading {
			_ = c.SetReadDeadline(time.Now())
		}
		f.mu.Unlock()
	})
	return nil
}

func (f *front) Addr() net.Addr { return f.s.proxyLn.Addr() }

// wait returns when no connection is being read any more.
func (f *front) wait() { f.wg.Wait() }

func (f *front) serveConn(c net.Conn) {
	defer f.wg.Done()
	head := &io.LimitedReader{R: c, N: maxHeadBytes}
	br := frontReaders.Get().(*bufio.Reader)
	br.Reset(head)
	_ = c.SetReadDeadline(time.Now().Add(f.s.cfg.HeaderTimeout))
	first, _ := br.Peek(len("CONNECT "))
	if !bytes.Equal(first, []byte("CONNECT ")) {
		f.handOff(c, br)
		return
	}
	req, err := http.ReadRequest(br)
	f.mu.Lock()
	delete(f.reading, c)
	f.mu.Unlock()
	if err == nil {
		err = checkConnectRequest(req)
	}
	if err != nil {
		status := "400 Bad Request"
		select {
		case <-f.done: // woken by the drain
			f.finish(c, br, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nX-Compass-Egress: error; reason=draining\r\nContent-Length: 0\r\n\r\n")
			return
		default:
		}
		if head.N <= 0 {
			status = "431 Request Header Fields Too Large"
		}
		f.finish(c, br, "HTTP/1.1 "+status+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+status)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var buffered []byte
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		buffered = append([]byte(nil), b...)
	}
	br.Reset(nil)
	frontReaders.Put(br)

	s := f.s
	req.RemoteAddr = c.RemoteAddr().String()
	rs := s.current.Load()
	v := s.decideTunnel(context.Background(), rs, req.URL.Host, req.RemoteAddr)
	if !v.Allowed {
		_ = refusalResponse(req, rs, typeConnect, v).Write(c)
	} else if s.openTunnel(req, c, buffered, rs, v) {
		return
	}
	f.closeAnswered(c)
}

// checkConnectRequest refuses what the HTTP server would refuse in a CONNECT request.
func checkConnectRequest(r *http.Request) error {
	if len(r.Header["Host"]) > 1 {
		return errors.New("too many Host headers")
	}
	if r.ProtoMajor != 1 {
		return errors.New("not HTTP/1")
	}
	return nil
}

// finish writes a last answer to a connection the front gives up on and closes it.
func (f *front) finish(c net.Conn, br *bufio.Reader, answer string) {
	br.Reset(nil)
	frontReaders.Put(br)
	_ = c.SetWriteDeadline(time.Now().Add(f.s.cfg.HeaderTimeout))
	_, _ = io.WriteString(c, answer)
	f.closeAnswered(c)
}

// lingerTime bounds how long closeAnswered waits for a client to stop sending.
const lingerTime = 500 * time.Millisecond

// closeAnswered closes a connection after its last answer. Closing a socket with unread
// input makes the kernel send a reset, which can destroy the answer before the client
// reads it; so it first ends its own side and reads what the client still sends, for a
// bounded time and amount, as net/http's server does.
func (f *front) closeAnswered(c net.Conn) {
	if hc, ok := c.(halfCloser); ok && hc.CloseWrite() == nil {
		_ = c.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.CopyN(io.Discard, c, 256<<10)
	}
	c.Close()
	f.s.proxyLn.release()
}

// handOff gives a connection to the HTTP server, unless the proxy is shutting down.
func (f *front) handOff(c net.Conn, br *bufio.Reader) {
	f.mu.Lock()
	delete(f.reading, c)
	f.mu.Unlock()
	rc := &replayConn{Conn: c, br: br}
	select {
	case f.handoff <- rc:
	case <-f.done:
		rc.release()
		c.Close()
		f.s.proxyLn.release()
	}
}

// replayConn is a connection handed to the HTTP server: its reads return what the front
// had read first, then go to the socket. It offers no ReadFrom or WriteTo of its own,
// so no copy can reach around the replayed bytes to the socket.
type replayConn struct {
	net.Conn
	br *bufio.Reader // nil once drained
}

func (c *replayConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.release()
	}
	return c.Conn.Read(p)
}

func (c *replayConn) release() {
	c.br.Reset(nil)
	frontReaders.Put(c.br)
	c.br = nil
}

// CloseWrite keeps half-close working for a tunnel opened on a handed-off connection.
func (c *replayConn) CloseWrite() error {
	if hc, ok := c.Conn.(halfCloser); ok {
		return hc.CloseWrite()
	}
	return c.Conn.Close()
}
