package dnsserver

import (
	"testing"

	"github.com/miekg/dns"
)

// The qtype label names the common types and lumps the rest as "other".
func TestTypeLabel(t *testing.T) {
	for qtype, want := range map[uint16]string{dns.TypeA: "A", dns.TypeAAAA: "AAAA", dns.TypeHTTPS: "HTTPS", dns.TypeSVCB: "SVCB", dns.TypeNULL: "other"} {
		if got := typeLabel(qtype); got != want {
			t.Errorf("typeLabel(%d) = %q, want %q", qtype, got, want)
		}
	}
}
