package main

import (
	"io"
	"net"
	"strings"
	"testing"
)

// serveTCP answers each connection on a loopback listener with serve.
func serveTCP(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serve(c)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestSSHExchange: reached only when the server speaks first with an SSH banner and
// echoes; a connection the sidecar accepts and then closes without a byte is blocked.
func TestSSHExchange(t *testing.T) {
	tests := []struct {
		name    string
		serve   func(net.Conn)
		wantErr string
	}{
		{"banner then echo", func(c net.Conn) {
			io.WriteString(c, "SSH-2.0-fakenet\r\n")
			buf := make([]byte, 64)
			n, _ := c.Read(buf)
			c.Write(buf[:n])
		}, ""},
		{"closed without a byte", func(c net.Conn) {}, "no banner: EOF"},
		{"not SSH", func(c net.Conn) { io.WriteString(c, "HTTP/1.1 403 Forbidden\r\n") }, "not an SSH banner"},
		{"banner, no echo", func(c net.Conn) { io.WriteString(c, "SSH-2.0-other\r\n") }, "then echo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			banner, err := sshExchange(serveTCP(t, tt.serve))
			if tt.wantErr == "" {
				if err != nil || banner != "SSH-2.0-fakenet" {
					t.Fatalf("banner %q, %v", banner, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestUDPEcho: reached only when the datagram comes back; a dropped one times out.
func TestUDPEcho(t *testing.T) {
	echo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 100)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			echo.WriteTo(buf[:n], from)
		}
	}()
	if err := udpEcho(echo.LocalAddr().String(), "answer=42"); err != nil {
		t.Fatalf("echo server: %v", err)
	}
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if err := udpEcho(silent.LocalAddr().String(), "answer=42"); err == nil || !strings.Contains(err.Error(), "no echo") {
		t.Fatalf("silent server: %v; want no echo", err)
	}
}
