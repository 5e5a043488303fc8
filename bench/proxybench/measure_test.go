package proxybench

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testProxy is the smallest HTTP proxy the measurements can run through: CONNECT
// tunnels and keep-alive absolute-URI GETs, one upstream connection per client
// connection. With tunnelLimit set, it answers 403 to every CONNECT after that many.
type testProxy struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn

	tunnelLimit, tunnels atomic.Int64
}

func startTestProxy(t *testing.T) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.track(c)
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *testProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *testProxy) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	var up net.Conn
	var upR *bufio.Reader
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		if req.Method == http.MethodConnect && p.tunnelLimit.Load() > 0 && p.tunnels.Add(1) > p.tunnelLimit.Load() {
			io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
			return
		}
		if up == nil {
			if up, err = net.Dial("tcp", req.Host); err != nil {
				return
			}
			p.track(up)
			defer up.Close()
			upR = bufio.NewReader(up)
		}
		if req.Method == http.MethodConnect {
			io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			p.wg.Go(func() { io.Copy(up, r); up.Close() })
			io.Copy(c, upR)
			return
		}
		req.RequestURI = ""
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(upR, req)
		if err != nil {
			return
		}
		err = resp.Write(c)
		resp.Body.Close()
		if err != nil {
			return
		}
	}
}

func TestMeasurements(t *testing.T) {
	up, err := StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	proxy := startTestProxy(t)
	lim := Limits{
		Duration:        100 * time.Millisecond,
		BulkBytes:       1 << 30,
		Setups:          50,
		Requests:        200,
		Concurrency:     4,
		LatencyRequests: 30,
		IdleTunnels:     20,
	}
	self := func() []int { return []int{os.Getpid()} }
	for _, target := range []Target{
		{Name: "direct"},
		{Name: "proxy", Proxy: proxy.ln.Addr().String(), PIDs: self},
	} {
		t.Run(target.Name, func(t *testing.T) {
			bulk, err := Bulk(target, up.StreamAddr(), lim)
			if err != nil || bulk.Ops == 0 {
				t.Errorf("Bulk = %+v, %v; want bytes and no error", bulk, err)
			}
			setups := Setups(target, up.StreamAddr(), lim)
			if setups.Errors != 0 || setups.Ops == 0 || setups.Ops > int64(lim.Setups) {
				t.Errorf("Setups = %+v; want 1..%d set-ups and no error", setups, lim.Setups)
			}
			reqs := Requests(target, up.HTTPAddr(), lim)
			if reqs.Errors != 0 || reqs.Ops == 0 || reqs.Ops > int64(lim.Requests) {
				t.Errorf("Requests = %+v; want 1..%d requests and no error", reqs, lim.Requests)
			}
			lat, err := Latencies(target, up.HTTPAddr(), lim)
			if err != nil || len(lat) == 0 || len(lat) > lim.LatencyRequests {
				t.Errorf("Latencies = %d samples, %v; want 1..%d and no error", len(lat), err, lim.LatencyRequests)
			}
			_, opened, err := IdleMemory(target, up.StreamAddr(), lim, 0)
			if target.Direct() {
				if err == nil {
					t.Error("IdleMemory of a direct target succeeded; it has no process to measure")
				}
				return
			}
			if err != nil || opened != lim.IdleTunnels {
				t.Errorf("IdleMemory opened %d tunnels, %v; want %d", opened, err, lim.IdleTunnels)
			}
		})
	}
}

func TestTunnelRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
	})
	_, _, err = dialTunnel(Target{Name: "deny", Proxy: ln.Addr().String()}, "127.0.0.1:9")
	if err == nil {
		t.Fatal("a CONNECT answered 403 was taken as a tunnel")
	}
}
