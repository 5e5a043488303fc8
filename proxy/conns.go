package proxy

import (
	"net/netip"
	"sync"
)

// liveConn is one connection carrying traffic to a destination: a CONNECT tunnel or an
// HTTP request in flight (a streaming body, a websocket).
type liveConn struct {
	typ  string
	name string
	addr netip.Addr
	port uint16
	// serverName is a tunnel's TLS server name when it differs from name, and
	// encryptedHello whether its ClientHello hid one (see helloGate); set under the
	// tracker's lock, so a sweep re-checks them.
	serverName     string
	encryptedHello bool
	// close cuts the connection on both sides; it may be called more than once. A
	// non-nil settle finishes a cut that must wait (a tunnel's 200 on its way out), and
	// is called once every connection's close has started, so the waits overlap.
	close func() (settle func())
	// recheck, when set, is how a swap re-decides the connection (a transparent one
	// decided on the names its client was answered); else by name and address.
	recheck func(*RuleSet) bool
}

// tracker holds every live connection so a rule swap can re-decide each of them.
type tracker struct {
	mu    sync.Mutex
	conns map[*liveConn]struct{}
}

func newTracker() *tracker { return &tracker{conns: make(map[*liveConn]struct{})} }

func (t *tracker) add(c *liveConn) {
	t.mu.Lock()
	t.conns[c] = struct{}{}
	t.mu.Unlock()
}

func (t *tracker) remove(c *liveConn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// closeIf closes (and forgets) every connection for which cut returns true, and
// returns how many it closed, once each of them is closed. It holds the lock while it
// sweeps, so a connection added after it returns is one whose owner will see the rule
// set published before the call.
func (t *tracker) closeIf(cut func(*liveConn) bool) int {
	settles, n := t.sweep(cut)
	for _, settle := range settles {
		settle()
	}
	return n
}

// sweep closes and forgets the connections cut selects, under the lock. The unlock is
// deferred: a panic in cut or in a close, which the control server's net/http
// recovers, must not leave every later connection (tracker.add) waiting for the lock.
func (t *tracker) sweep(cut func(*liveConn) bool) (settles []func(), n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		if cut(c) {
			if settle := c.close(); settle != nil {
				settles = append(settles, settle)
			}
			delete(t.conns, c)
			n++
		}
	}
	return settles, n
}

// addrOf is c's address as last recorded.
func (t *tracker) addrOf(c *liveConn) netip.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	return c.addr
}

// setServerName records what the ClientHello of c, a tunnel, asked for.
func (t *tracker) setServerName(c *liveConn, name string, encrypted bool) {
	t.mu.Lock()
	c.serverName, c.encryptedHello = name, encrypted
	t.mu.Unlock()
}

// setAddr records the address an HTTP request's upstream connection really goes to (a
// pooled connection may predate the request's own lookup).
func (t *tracker) setAddr(c *liveConn, a netip.Addr) {
	t.mu.Lock()
	c.addr = a
	t.mu.Unlock()
}
