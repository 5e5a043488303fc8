package procnet

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
)

// RouteGateways are the next hops of this host's routes, IPv4 and IPv6. In a sidecar
// they are the Docker host's end of each bridge, where the host's own services answer
// (a daemon listening on 0.0.0.0, a resolver, a metadata relay): the proxy's guard
// treats them as it treats the proxy's own addresses. They are read below procRoot; a
// file that cannot be read adds nothing.
func RouteGateways(procRoot string) []netip.Addr {
	var out []netip.Addr
	if b, err := os.ReadFile(filepath.Join(procRoot, "net", "route")); err == nil {
		out = append(out, parseIPv4RouteGateways(b)...)
	}
	if b, err := os.ReadFile(filepath.Join(procRoot, "net", "ipv6_route")); err == nil {
		out = append(out, parseIPv6RouteGateways(b)...)
	}
	return out
}

// rtfGateway is RTF_GATEWAY: the route goes through a next hop.
const rtfGateway = 0x2

// parseIPv4RouteGateways reads /proc/net/route: a header line, then "Iface Destination
// Gateway Flags ...", the addresses as native-endian words in hex.
func parseIPv4RouteGateways(b []byte) []netip.Addr {
	var out []netip.Addr
	lines := bytes.Split(b, []byte("\n"))
	for _, line := range lines[min(1, len(lines)):] {
		f := bytes.Fields(line)
		if len(f) < 4 {
			continue
		}
		gw, ok := hexWord(f[2])
		flags, fok := hexWord(f[3])
		if !ok || !fok || flags&rtfGateway == 0 || gw == 0 {
			continue
		}
		var a [4]byte
		binary.NativeEndian.PutUint32(a[:], gw)
		out = append(out, netip.AddrFrom4(a))
	}
	return out
}

// parseIPv6RouteGateways reads /proc/net/ipv6_route: "dest plen src plen nexthop metric
// refcnt use flags dev", addresses as 32 hex digits in network order.
func parseIPv6RouteGateways(b []byte) []netip.Addr {
	var out []netip.Addr
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) < 9 || len(f[4]) != 32 {
			continue
		}
		flags, ok := hexWord(f[8])
		var a [16]byte
		if _, err := hex.Decode(a[:], f[4]); err != nil || !ok || flags&rtfGateway == 0 {
			continue
		}
		if gw := netip.AddrFrom16(a); !gw.IsUnspecified() {
			out = append(out, gw)
		}
	}
	return out
}

// hexWord reads up to eight hex digits.
func hexWord(s []byte) (uint32, bool) {
	v, err := strconv.ParseUint(string(s), 16, 32)
	return uint32(v), err == nil
}
