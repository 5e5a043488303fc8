// Package connio is the proxy's connection plumbing: the listeners (plain TCP,
// keep-alive, connection limits), the tunnel relay, and the bounds that end a
// connection or request that moves no byte (idle clocks and watches, idle deadlines,
// the watch for a client that left, the stop of a tunnel's dial). It knows nothing of
// policy or of the proxy's server: what a watch ends it reaches through Request, what
// holds a tunnel's first bytes through Gate.
package connio

// Request is the request a watch bounds. A watch that finds it idle, or its client
// gone, cancels it; a watch (or a websocket relay's copy) that panicked on a goroutine
// of its own reports the value recovered, and the request is cut with it.
type Request interface {
	Cancel()
	Recovered(p any)
}

// Gate holds the first bytes a direction relays until it has decided on them (the
// proxy's check of a tunnel's TLS ClientHello).
type Gate interface {
	// Skips reports whether p, the first bytes of the stream, need no decision: then
	// they and all that follows pass, and the gate is dropped. It runs on the relay's
	// own goroutine, so it must need no stack to speak of.
	Skips(p []byte) bool
	// Feed takes the next bytes and returns those that may pass now (none while the
	// gate waits for more) and whether it has decided; an error ends the direction.
	Feed(p []byte) (out []byte, done bool, err error)
}
