package proxybench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSquidConfWorkers(t *testing.T) {
	for _, tt := range []struct {
		workers int
		want    string // the workers line, "" for none (squid's default, one)
	}{
		{0, ""},
		{1, ""},
		{2, "workers 2"},
		{4, "workers 4"},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "squid.conf")
		if err := writeSquidConf(path, dir, "127.0.0.1:3128", tt.workers, false); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "workers") {
				got = l
			}
		}
		if got != tt.want {
			t.Errorf("workers %d: configuration has %q, want %q", tt.workers, got, tt.want)
		}
		if !strings.Contains(string(b), "http_port 127.0.0.1:3128\n") {
			t.Errorf("workers %d: no http_port line in\n%s", tt.workers, b)
		}
	}
}
