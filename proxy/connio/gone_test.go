package connio

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pastDeadlineConn reports the first read deadline set in the past (the stop's wake-up)
// on past.
type pastDeadlineConn struct {
	net.Conn
	once sync.Once
	past chan struct{}
}

func (c *pastDeadlineConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Now()) {
		c.once.Do(func() { close(c.past) })
	}
	return c.Conn.SetReadDeadline(t)
}

// A stop that comes as the watch's timer fires, before the watch has begun its read,
// must keep that read from starting: the read would clear the stop's wake-up deadline
// and wait for the client, and the stop (and so the end of the request's answer and the
// connection's next request) with it, for as long as the client sends nothing.
func TestWatchStoppedBeforeItsReadDoesNotRead(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	conn := &pastDeadlineConn{Conn: server, past: make(chan struct{})}
	var left atomic.Bool
	var w GoneWatch
	w.Arm(conn, &fakeRequest{t: t, cancel: func() {}}, time.Hour, &left)
	// The timer has fired: its watch is yet to run.
	if !w.timer.Stop() {
		t.Fatal("the timer fired")
	}
	stopped := make(chan []byte, 1)
	go func() { stopped <- w.Stop() }()
	select {
	case <-conn.past:
	case <-time.After(hangGuard):
		t.Fatal("the stop set no wake-up deadline")
	}
	go w.watch()
	select {
	case pending := <-stopped:
		if pending != nil {
			t.Errorf("the stop returned %q, want nothing", pending)
		}
	case <-time.After(hangGuard):
		client.Close() // ends the read
		<-stopped
		t.Fatalf("the stop still waits %v later: the watch read after the stop began", hangGuard)
	}
	if left.Load() {
		t.Error("a stopped watch took the client for gone")
	}
}
