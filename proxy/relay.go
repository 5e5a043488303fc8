package proxy

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// relayBufSize is the read size of a relay before it moves to splice: a read that
// fills it means bulk data is flowing.
const relayBufSize = 16 << 10

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// pump copies src to dst until EOF (nil error) or an error. Between two *net.TCPConn
// it starts with plain reads and writes through a pooled buffer that it holds only
// while bytes move (it waits for input in the poller with no buffer), and moves to
// splice (TCPConn.ReadFrom, no copy through user space) once a read fills the buffer,
// remembering that in *bulk. Short exchanges (TLS handshakes, requests and answers,
// tunnel set-ups) so need no pipe: splice takes a pipe pair per direction, kept while
// the direction waits, and the pipes' set-up and teardown were a tenth of the proxy's
// CPU per tunnel set-up.
func pump(dst, src net.Conn, bulk *bool) (int64, error) {
	d, dok := dst.(*net.TCPConn)
	s, sok := src.(*net.TCPConn)
	if !dok || !sok {
		return io.Copy(dst, src)
	}
	var n int64
	if !*bulk {
		m, full, err := copyUntilBulk(d, s)
		n += m
		if !full {
			return n, err
		}
		*bulk = true
	}
	m, err := d.ReadFrom(s)
	return n + m, err
}

// copyUntilBulk relays with read and write until EOF, an error, or a read that fills
// the buffer (full).
func copyUntilBulk(dst, src *net.TCPConn) (n int64, full bool, err error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	for {
		var (
			buf  *[]byte
			nr   int
			rerr error
		)
		err = rc.Read(func(fd uintptr) bool {
			buf = relayBufs.Get().(*[]byte)
			for {
				nr, rerr = syscall.Read(int(fd), *buf)
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				relayBufs.Put(buf)
				return false // wait until readable
			}
			return true
		})
		if err != nil {
			return n, false, err // the deadline, or the connection closed
		}
		if rerr != nil {
			relayBufs.Put(buf)
			return n, false, os.NewSyscallError("read", rerr)
		}
		if nr <= 0 {
			relayBufs.Put(buf)
			return n, false, nil
		}
		w, werr := dst.Write((*buf)[:nr])
		n += int64(w)
		relayBufs.Put(buf)
		if werr != nil {
			return n, false, werr
		}
		if nr == relayBufSize {
			return n, true, nil
		}
	}
}
