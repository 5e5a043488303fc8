package nftredirect

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// exprs builds a rule's expressions the way the nft tool compiles the same
// rule, so that `nft list table` prints it in its usual short form.
type exprs []expr.Any

const (
	eq  = expr.CmpOpEq
	neq = expr.CmpOpNeq
	reg = 1 // every match loads into and compares register 1
)

func (e exprs) cmp(op expr.CmpOp, data []byte) exprs {
	return append(e, &expr.Cmp{Op: op, Register: reg, Data: data})
}

func (e exprs) meta(key expr.MetaKey) exprs {
	return append(e, &expr.Meta{Key: key, Register: reg})
}

func (e exprs) iifname(name string) exprs {
	b := make([]byte, unix.IFNAMSIZ) // exact match: the name padded with NULs
	copy(b, name)
	return e.meta(expr.MetaKeyIIFNAME).cmp(eq, b)
}

func (e exprs) nfproto(op expr.CmpOp, proto byte) exprs {
	return e.meta(expr.MetaKeyNFPROTO).cmp(op, []byte{proto})
}

func (e exprs) l4proto(proto byte) exprs {
	return e.meta(expr.MetaKeyL4PROTO).cmp(eq, []byte{proto})
}

func (e exprs) payload(base expr.PayloadBase, offset, length uint32) exprs {
	return append(e, &expr.Payload{DestRegister: reg, Base: base, Offset: offset, Len: length})
}

// ipSaddr and ipDaddr read the IPv4 header (offsets 12 and 16); callers match
// nfproto ipv4 first, as nft does for `ip saddr` in an inet table.
func (e exprs) ipSaddr(op expr.CmpOp, a netip.Addr) exprs {
	b := a.As4()
	return e.payload(expr.PayloadBaseNetworkHeader, 12, 4).cmp(op, b[:])
}

// daddrNotLocal is `fib daddr type != local`: the destination is no address of
// this namespace's. The address type is a host-endian u32, as nft writes it.
func (e exprs) daddrNotLocal() exprs {
	return append(e, &expr.Fib{Register: reg, FlagDADDR: true, ResultADDRTYPE: true}).
		cmp(neq, binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL))
}

// dport reads the destination port of TCP or UDP (offset 2 in both headers).
func (e exprs) dport(port uint16) exprs {
	return e.payload(expr.PayloadBaseTransportHeader, 2, 2).cmp(eq, be16(port))
}

func (e exprs) count(c Class) exprs {
	return append(e, &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: string(c)})
}

// redirect spells out the port range and flag the kernel fills in for a
// single port, so that a rule read back encodes exactly as written.
func (e exprs) redirect(port uint16) exprs {
	return append(e, &expr.Immediate{Register: reg, Data: be16(port)},
		&expr.Redir{RegisterProtoMin: reg, RegisterProtoMax: reg, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
}

// dnat is `dnat ip to addr:port`, with the flags the kernel reports back.
func (e exprs) dnat(to netip.AddrPort) exprs {
	a := to.Addr().As4()
	return append(e, &expr.Immediate{Register: reg, Data: a[:]},
		&expr.Immediate{Register: reg + 1, Data: be16(to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4,
			RegAddrMin: reg, RegAddrMax: reg, RegProtoMin: reg + 1, RegProtoMax: reg + 1, Specified: true})
}

func (e exprs) verdict(kind expr.VerdictKind, chain string) exprs {
	return append(e, &expr.Verdict{Kind: kind, Chain: chain})
}

func (e exprs) accept() exprs           { return e.verdict(expr.VerdictAccept, "") }
func (e exprs) drop() exprs             { return e.verdict(expr.VerdictDrop, "") }
func (e exprs) jump(chain string) exprs { return e.verdict(expr.VerdictJump, chain) }

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
