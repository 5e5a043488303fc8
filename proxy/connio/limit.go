package connio

import (
	"net"
	"sync"
)

// LimitListener bounds concurrent client connections. Unlike a wrapping limiter it
// hands out the accepted *net.TCPConn itself, so tunnels can still splice; the slot is
// released by whoever owns the connection last: the front when it closes one, a tunnel
// when it ends, the settling of a websocket relay.
type LimitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewLimitListener bounds l to max connections at a time; 0: no bound.
func NewLimitListener(l net.Listener, max int) *LimitListener {
	ll := &LimitListener{Listener: l, done: make(chan struct{})}
	if max > 0 {
		ll.sem = make(chan struct{}, max)
	}
	return ll
}

func (l *LimitListener) Accept() (net.Conn, error) {
	if l.sem != nil {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		l.Release()
		return nil, err
	}
	return c, nil
}

// Hold takes a slot for a connection that did not come through Accept, waiting while
// every slot is taken; Release gives it back.
func (l *LimitListener) Hold() {
	if l.sem != nil {
		l.sem <- struct{}{}
	}
}

// Held is how many slots are taken.
func (l *LimitListener) Held() int { return len(l.sem) }

// Release gives back the slot of an accepted connection.
func (l *LimitListener) Release() {
	if l.sem != nil {
		<-l.sem
	}
}

func (l *LimitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// CapListener bounds concurrent connections of a server that owns its connections
// (the DNS server over TCP): each accepted connection holds a slot until it is closed.
// Further clients wait in the kernel's accept queue.
type CapListener struct {
	*LimitListener
}

// NewCapListener bounds l to max connections open at a time.
func NewCapListener(l net.Listener, max int) net.Listener {
	return CapListener{NewLimitListener(l, max)}
}

func (l CapListener) Accept() (net.Conn, error) {
	c, err := l.LimitListener.Accept()
	if err != nil {
		return nil, err
	}
	return &slotConn{Conn: c, release: l.Release}, nil
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
