package main

import (
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

const rootsChildEnv = "COMPASS_PROXY_TEST_ROOTS_CHILD"

// TestTrustRootsWithoutABundle: the image is FROM scratch, with no CA bundle, yet the
// proxy verifies the certificates of https:// upstreams (absolute-URI requests) against
// roots compiled in. The check runs in a child whose SSL_CERT_FILE and SSL_CERT_DIR
// name nothing, as in the image: Go reads the system roots once, at first use.
func TestTrustRootsWithoutABundle(t *testing.T) {
	if os.Getenv(rootsChildEnv) == "1" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			t.Fatalf("no roots without a bundle: %v", err)
		}
		if pool.Equal(x509.NewCertPool()) {
			t.Fatal("the roots without a bundle are empty")
		}
		return
	}
	nowhere := filepath.Join(t.TempDir(), "none")
	cmd := exec.Command(os.Args[0], "-test.run=^TestTrustRootsWithoutABundle$", "-test.count=1")
	cmd.Env = append(os.Environ(), rootsChildEnv+"=1", "SSL_CERT_FILE="+nowhere, "SSL_CERT_DIR="+nowhere)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
