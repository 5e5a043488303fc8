// Package fqdncache remembers which names the sidecar's DNS server answered each client
// with each address, so that a transparent connection carrying no name of its own (SSH,
// a database protocol) can be decided on the name the client looked up, as Cilium's FQDN
// policies do. Only answers the policy allowed are ever recorded, so a name found here
// gives a client nothing an explicit CONNECT to that name would not.
package fqdncache

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Limits bound the cache: an agent that resolves names without end must not grow the
// sidecar's memory without end. A zero field takes its default.
type Limits struct {
	Clients         int           // clients remembered at once; 0: 64
	AddrsPerClient  int           // addresses remembered per client; 0: 4096
	NamesPerAddress int           // names remembered per address; 0: 16
	Grace           time.Duration // how long past its TTL, or its last connection, a name stays; 0: 30s
}

func (l Limits) withDefaults() Limits {
	if l.Clients == 0 {
		l.Clients = 64
	}
	if l.AddrsPerClient == 0 {
		l.AddrsPerClient = 4096
	}
	if l.NamesPerAddress == 0 {
		l.NamesPerAddress = 16
	}
	if l.Grace == 0 {
		l.Grace = 30 * time.Second
	}
	return l
}

// Cache is safe for concurrent use.
type Cache struct {
	lim Limits
	now func() time.Time

	mu      sync.Mutex
	clients map[netip.Addr]*client
}

type client struct {
	addrs    map[netip.Addr]*entry
	lastSeen time.Time
}

// entry is one address's names for one client. A name is usable until its expiry, and
// for as long as a connection to the address holds the entry (see Hold).
type entry struct {
	names map[string]time.Time // name → expiry
	holds int
}

// New makes a cache; now is the clock (time.Now when nil; tests pass their own).
func New(lim Limits, now func() time.Time) *Cache {
	if now == nil {
		now = time.Now
	}
	return &Cache{lim: lim.withDefaults(), now: now, clients: map[netip.Addr]*client{}}
}

// Record notes that the DNS server answered c's query for name with addrs, valid for
// ttl. It reports false when the bounds left no room (every slot is held by a live
// connection): the name is then not learned, and a connection that needs it is
// decided on its address alone, which can only refuse more.
func (c *Cache) Record(from netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) bool {
	now := c.now()
	expiry := now.Add(ttl + c.lim.Grace)
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.client(from.Unmap(), now)
	if cl == nil {
		return false
	}
	ok := true
	for _, a := range addrs {
		e := cl.entry(a.Unmap(), now, c.lim.AddrsPerClient)
		if e == nil || !e.add(name, expiry, now, c.lim.NamesPerAddress) {
			ok = false
		}
	}
	return ok
}

// Names returns the names c was answered addr with that are still usable, sorted.
func (c *Cache) Names(from, addr netip.Addr) []string {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.clients[from.Unmap()]
	if cl == nil {
		return nil
	}
	e := cl.addrs[addr.Unmap()]
	if e == nil {
		return nil
	}
	var names []string
	for n, exp := range e.names {
		if e.holds > 0 || now.Before(exp) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// Hold keeps the names of addr usable for from while a connection to it lives; release
// (idempotent) ends the hold, and the names then stay for the grace at least. It holds
// nothing, and release is a no-op, when no name is known.
func (c *Cache) Hold(from, addr netip.Addr) (release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.clients[from.Unmap()]
	if cl == nil || cl.addrs[addr.Unmap()] == nil {
		return func() {}
	}
	e := cl.addrs[addr.Unmap()]
	e.holds++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			e.holds--
			if e.holds == 0 {
				floor := c.now().Add(c.lim.Grace)
				for n, exp := range e.names {
					if exp.Before(floor) {
						e.names[n] = floor
					}
				}
			}
		})
	}
}

// client finds or makes from's record, evicting the least recently seen client whose
// entries are all unheld when the bound is reached. Called with c.mu held.
func (c *Cache) client(from netip.Addr, now time.Time) *client {
	if cl := c.clients[from]; cl != nil {
		cl.lastSeen = now
		return cl
	}
	if len(c.clients) >= c.lim.Clients {
		var victim netip.Addr
		var oldest *client
		for a, cl := range c.clients {
			if !cl.held() && (oldest == nil || cl.lastSeen.Before(oldest.lastSeen)) {
				victim, oldest = a, cl
			}
		}
		if oldest == nil {
			return nil
		}
		delete(c.clients, victim)
	}
	cl := &client{addrs: map[netip.Addr]*entry{}, lastSeen: now}
	c.clients[from] = cl
	return cl
}

func (cl *client) held() bool {
	for _, e := range cl.addrs {
		if e.holds > 0 {
			return true
		}
	}
	return false
}

// entry finds or makes addr's entry; at the bound it first drops expired unheld
// entries, then the unheld entry that expires first.
func (cl *client) entry(addr netip.Addr, now time.Time, bound int) *entry {
	if e := cl.addrs[addr]; e != nil {
		return e
	}
	if len(cl.addrs) >= bound {
		var victim netip.Addr
		var soonest time.Time
		for a, e := range cl.addrs {
			if e.holds > 0 {
				continue
			}
			last := e.lastExpiry()
			if !last.After(now) {
				delete(cl.addrs, a)
				continue
			}
			if soonest.IsZero() || last.Before(soonest) {
				victim, soonest = a, last
			}
		}
		if len(cl.addrs) >= bound {
			if soonest.IsZero() {
				return nil
			}
			delete(cl.addrs, victim)
		}
	}
	e := &entry{names: map[string]time.Time{}}
	cl.addrs[addr] = e
	return e
}

func (e *entry) lastExpiry() time.Time {
	var last time.Time
	for _, exp := range e.names {
		if exp.After(last) {
			last = exp
		}
	}
	return last
}

// add records name until expiry (never shortening an expiry already known); at the
// bound it drops expired names first, then the one that expires first.
func (e *entry) add(name string, expiry, now time.Time, bound int) bool {
	if old, ok := e.names[name]; ok {
		if expiry.After(old) {
			e.names[name] = expiry
		}
		return true
	}
	if len(e.names) >= bound {
		var victim string
		var soonest time.Time
		for n, exp := range e.names {
			if !exp.After(now) && e.holds == 0 {
				delete(e.names, n)
				continue
			}
			if soonest.IsZero() || exp.Before(soonest) {
				victim, soonest = n, exp
			}
		}
		if len(e.names) >= bound {
			if e.holds > 0 {
				return false
			}
			delete(e.names, victim)
		}
	}
	e.names[name] = expiry
	return true
}
