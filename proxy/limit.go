package proxy

import (
	"net"
	"sync"
)

// limitListener bounds concurrent client connections. Unlike a wrapping limiter it
// hands out the accepted *net.TCPConn itself, so tunnels can still splice; the slot is
// released by whoever owns the connection last: the front when it closes one, a tunnel
// when it ends, the settling of a websocket relay.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, max int) *limitListener {
	ll := &limitListener{Listener: l, done: make(chan struct{})}
	if max > 0 {
		ll.sem = make(chan struct{}, max)
	}
	return ll
}

func (l *limitListener) Accept() (net.Conn, error) {
	if l.sem != nil {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		l.release()
		return nil, err
	}
	return c, nil
}

func (l *limitListener) release() {
	if l.sem != nil {
		<-l.sem
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// capListener bounds concurrent connections of a server that owns its connections
// (the DNS server over TCP): each accepted connection holds a slot until it is closed.
// Further clients wait in the kernel's accept queue.
type capListener struct {
	*limitListener
}

func newCapListener(l net.Listener, max int) net.Listener {
	return capListener{newLimitListener(l, max)}
}

func (l capListener) Accept() (net.Conn, error) {
	c, err := l.limitListener.Accept()
	if err != nil {
		return nil, err
	}
	return &slotConn{Conn: c, release: l.release}, nil
}

// slotConn gives its listener slot back when closed (once).
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
