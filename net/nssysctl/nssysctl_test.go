package nssysctl_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/nssysctl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSetGetStaysInNamespace writes a forwarding sysctl in one namespace and
// checks that a second namespace kept its own value.
func TestSetGetStaysInNamespace(t *testing.T) {
	a := netnstest.New(t, "sysctl")
	b := netnstest.New(t, "sysctl")
	const key = "net/ipv4/conf/all/forwarding"
	for _, v := range []string{"0", "1", "0"} {
		if err := nssysctl.Set(a.Handle, key, v); err != nil {
			t.Fatal(err)
		}
		if err := nssysctl.Set(b.Handle, key, flip(v)); err != nil {
			t.Fatal(err)
		}
		if got, err := nssysctl.Get(a.Handle, key); err != nil || got != v {
			t.Fatalf("Get(a) = %q, %v; want %q", got, err, v)
		}
		if got, err := nssysctl.Get(b.Handle, key); err != nil || got != flip(v) {
			t.Fatalf("Get(b) = %q, %v; want %q", got, err, flip(v))
		}
	}
}

func TestRefusesHostWideKey(t *testing.T) {
	if _, err := nssysctl.Get(0, "kernel/hostname"); err == nil {
		t.Fatal("Get(kernel/hostname) = nil error, want a refusal")
	}
}

func flip(v string) string {
	if v == "0" {
		return "1"
	}
	return "0"
}
