package proxy

import (
	"bufio"
	"encoding/hex"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
)

// procTCPSocket returns the fields of the IPv4 socket from local to remote in
// /proc/net/tcp: [1] local, [2] remote, [3] state, [5] timer kind and expiry, ...
func procTCPSocket(t *testing.T, local, remote netip.AddrPort) (fields []string, found bool) {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && procAddr(fields[1]) == local && procAddr(fields[2]) == remote {
			return fields, true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return nil, false
}

// procAddr reads /proc/net/tcp's "0100007F:1F90": the IPv4 address as a host-order
// (little-endian here) word in hex, then the port.
func procAddr(s string) netip.AddrPort {
	host, port, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(host)
	p, perr := strconv.ParseUint(port, 16, 16)
	if !ok || err != nil || perr != nil || len(b) != 4 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}), uint16(p))
}
