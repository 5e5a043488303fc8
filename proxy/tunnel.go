package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
)

// decideConnect decides a CONNECT request: the target must carry a port; refusals are
// written by goproxy (ConnectReject with our 403), allowed targets become our tunnel.
func (s *Server) decideConnect(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	r := ctx.Req
	st := stateOf(r)
	rs := s.current.Load()
	st.rs = rs
	v := Verdict{Host: host}
	if h, port, reason := splitAuthority(host, 0); reason != "" {
		v.Reason = reason
	} else {
		v = s.decide(r.Context(), rs, h, port)
	}
	s.record(rs, typeConnect, v, r.RemoteAddr)
	if !v.Allowed {
		ctx.Resp = refusalResponse(r, rs, typeConnect, v)
		return &goproxy.ConnectAction{Action: goproxy.ConnectReject}, host
	}
	st.verdict = v
	return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: s.tunnel}, host
}

// tunnel dials the checked address and relays bytes. Both sides stay *net.TCPConn so
// io.Copy splices in the kernel; each direction half-closes on EOF; bytes the client
// sent along with the CONNECT are forwarded first.
func (s *Server) tunnel(r *http.Request, client net.Conn, _ *goproxy.ProxyCtx) {
	st := stateOf(r)
	v, rs := st.verdict, st.rs
	fail := func(status, reason string) {
		fmt.Fprintf(client, "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nX-Compass-Egress: %s\r\nContent-Length: 0\r\n\r\n", status, reason)
	}
	up, addr, err := s.dialVerdict(r.Context(), &v)
	if err != nil {
		s.log.Warn("dial failed", "type", typeConnect, "host", blockedHost(v), "port", v.Port, "client", r.RemoteAddr, "error", err.Error())
		fail("502 Bad Gateway", "error; reason=dial-failed")
		return
	}
	// Until the 200 is written, a swap that cuts this tunnel closes only the upstream
	// side, so the client still gets a clean 403 rather than a bare EOF.
	var (
		mu          sync.Mutex
		established bool
		cut         bool
	)
	entry := &liveConn{typ: typeConnect, name: v.Name, addr: addr, port: v.Port}
	entry.close = func() {
		mu.Lock()
		defer mu.Unlock()
		up.Close()
		if established {
			client.Close()
		}
		cut = true
	}
	s.tracker.add(entry)
	refuse := func() {
		s.tracker.remove(entry)
		up.Close()
		cur := s.current.Load()
		v = s.redecide(cur, v)
		if v.Allowed { // cut by a swap that has since been swapped back
			v.Allowed, v.Reason = false, ReasonPolicyChanged
		}
		s.record(cur, typeConnect, v, r.RemoteAddr)
		_ = refusalResponse(r, cur, typeConnect, v).Write(client)
	}
	if cur := s.current.Load(); cur != rs && !s.decider.Recheck(cur, v.Name, addr, v.Port) {
		refuse()
		return
	}
	// Counted for the drain before the client hears 200: a drain that starts now waits
	// for this tunnel instead of cutting one it just confirmed.
	if !s.addTunnel() {
		s.tracker.remove(entry)
		up.Close()
		fail("503 Service Unavailable", "error; reason=draining")
		return
	}
	mu.Lock()
	if cut {
		mu.Unlock()
		s.tunnels.Done()
		refuse()
		return
	}
	_, err = io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n")
	established = true
	mu.Unlock()
	if err != nil {
		s.tracker.remove(entry)
		up.Close()
		s.tunnels.Done()
		return
	}
	st.tunnel = true
	s.metrics.active.WithLabelValues(typeConnect).Inc()
	// The goroutine keeps only what it logs: not the request, whose memory would
	// otherwise live as long as the tunnel.
	buffered, clientAddr, gen, task, phase := st.buffered, r.RemoteAddr, rs.Generation, rs.Task, rs.Phase
	st.buffered = nil
	go func() {
		defer s.tunnels.Done()
		start := time.Now()
		upBytes, downBytes := relay(client, up, buffered)
		s.tracker.remove(entry)
		s.proxyLn.release()
		s.metrics.bytes.WithLabelValues("upstream").Add(float64(upBytes))
		s.metrics.bytes.WithLabelValues("downstream").Add(float64(downBytes))
		s.log.Info("tunnel closed", "type", typeConnect, "host", blockedHost(v), "port", v.Port,
			"addr", addr.String(), "client", clientAddr, "bytes_up", upBytes, "bytes_down", downBytes,
			"duration_seconds", time.Since(start).Seconds(), "generation", gen, "task", task, "phase", phase)
		s.metrics.active.WithLabelValues(typeConnect).Dec()
	}()
}

// addTunnel counts a new tunnel for the drain, unless the drain has begun.
func (s *Server) addTunnel() bool {
	s.tunnelMu.Lock()
	defer s.tunnelMu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.tunnels.Add(1)
	return true
}

// halfCloser is what *net.TCPConn offers for a clean one-way EOF.
type halfCloser interface {
	CloseWrite() error
	CloseRead() error
}

// relay copies both ways until both directions ended and returns the byte counts from
// the copies themselves. pre holds client bytes that arrived with the request.
func relay(client, up net.Conn, pre []byte) (upBytes, downBytes int64) {
	done := make(chan int64, 1)
	go func() {
		n, err := io.Copy(client, up)
		endDirection(client, up, err)
		done <- n
	}()
	var err error
	if len(pre) > 0 {
		var n int
		n, err = up.Write(pre)
		upBytes = int64(n)
	}
	if err == nil {
		var n int64
		n, err = io.Copy(up, client)
		upBytes += n
	}
	endDirection(up, client, err)
	downBytes = <-done
	client.Close()
	up.Close()
	return upBytes, downBytes
}

// endDirection ends one direction: on EOF it passes the EOF on (half-close) so the
// other direction keeps flowing; on an error it closes both, which also stops the
// other direction's copy.
func endDirection(dst, src net.Conn, err error) {
	d, dok := dst.(halfCloser)
	s, sok := src.(halfCloser)
	if err == nil && dok && sok {
		_ = d.CloseWrite()
		_ = s.CloseRead()
		return
	}
	dst.Close()
	src.Close()
}
