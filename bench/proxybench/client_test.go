package proxybench

import (
	"bufio"
	"strings"
	"testing"
)

func TestReadHeader(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    respHeader
		wantErr bool
	}{
		{"keep-alive with length", "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n", respHeader{200, 64, false}, false},
		{"connection established", "HTTP/1.1 200 Connection established\r\n\r\n", respHeader{200, -1, false}, false},
		{"close announced", "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nConnection: close\r\n\r\n", respHeader{200, 3, true}, false},
		{"HTTP/1.0 closes by default", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", respHeader{200, 1, true}, false},
		{"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nProxy-Connection: keep-alive\r\n\r\n", respHeader{200, -1, false}, false},
		{"denied", "HTTP/1.1 403 Forbidden\r\n\r\n", respHeader{403, -1, false}, false},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", respHeader{}, true},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", respHeader{}, true},
		{"truncated", "HTTP/1.1 200 OK\r\nContent-Le", respHeader{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readHeader(bufio.NewReader(strings.NewReader(tt.in)))
			if tt.wantErr {
				if err == nil {
					t.Errorf("readHeader = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("readHeader = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestReadRequestHeader(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantClose bool
		wantErr   bool
	}{
		{"keep-alive", "GET /bench HTTP/1.1\r\nHost: x\r\n\r\n", false, false},
		{"close", "GET /bench HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", true, false},
		{"long line", "GET /bench HTTP/1.1\r\nX-Long: " + strings.Repeat("a", 9000) + "\r\n\r\n", false, false},
		{"long line ending at the buffer's end", "GET /bench HTTP/1.1\r\nX-Long: " + strings.Repeat("a", 4096-10) + "\r\nConnection: close\r\n\r\n", true, false},
		{"truncated", "GET /bench HTTP/1.1\r\nHost: x\r\n", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readRequestHeader(bufio.NewReaderSize(strings.NewReader(tt.in), 4096))
			if (err != nil) != tt.wantErr || got != tt.wantClose {
				t.Errorf("readRequestHeader = %v, %v; want %v, error %v", got, err, tt.wantClose, tt.wantErr)
			}
		})
	}
}
