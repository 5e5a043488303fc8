package harness

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller/docker"
)

// Busybox is where Debian's busybox-static puts its static binary; `make test` installs
// the package when it is missing (make busybox-static).
const Busybox = "/bin/busybox"

// busyboxRecipe makes a FROM-scratch image of busybox: its applets linked in /bin, /tmp,
// and an /etc/passwd (busybox wget crashes without one). RUN runs busybox itself, so
// the build pulls nothing.
const busyboxRecipe = `FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox mkdir -p /etc /tmp && /bin/busybox --install -s /bin && echo 'root:x:0:0:root:/:/bin/sh' > /etc/passwd"]
CMD ["/bin/sleep", "86400"]
`

// ClientsImage is the image of clients that ignore proxies: busybox (wget, nc,
// nslookup...) and /bin/goclient (images/goclient: a Go client with Proxy: nil, UDP
// and ICMP senders). Its default command sleeps. It is built on a test's first call;
// without a static busybox the test fails under CI and is skipped elsewhere.
func (h *Harness) ClientsImage(t testing.TB) string {
	t.Helper()
	h.clientsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		h.clientsErr = h.buildClientsImage(ctx)
	})
	if h.clientsErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("e2e clients image: %v", h.clientsErr)
		}
		t.Skipf("SKIPPING, no clients image: %v", h.clientsErr)
	}
	return h.clientsImage
}

// buildClientsImage builds busybox's image, then the clients image on top of it with
// goclient.
func (h *Harness) buildClientsImage(ctx context.Context) error {
	if err := staticELF(Busybox); err != nil {
		return fmt.Errorf("%w (install Debian's busybox-static: make busybox-static)", err)
	}
	specs := []docker.ImageSpec{
		{Tag: h.busyboxImage, Binary: Busybox, Name: "busybox", Recipe: busyboxRecipe},
		{Tag: h.clientsImage, Binary: filepath.Join(h.BinDir, "goclient"), Name: "goclient",
			Recipe: "FROM " + h.busyboxImage + "\nCOPY goclient /bin/goclient\n"},
	}
	for _, s := range specs {
		if err := docker.BuildImage(ctx, h.Docker, s); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	return nil
}

// staticELF fails unless path is an executable with no program interpreter: on an
// empty filesystem a dynamic one would not start.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("harness: %s is dynamically linked", path)
		}
	}
	return nil
}
