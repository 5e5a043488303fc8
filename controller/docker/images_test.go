package docker

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/build"

	"github.com/compass-egress/compass-egress/internal/buildinfo"
)

// buildRecorder is an engine that records an image build instead of running it.
type buildRecorder struct {
	dockerAPI
	opts    build.ImageBuildOptions
	context map[string]*tar.Header
	files   map[string]string
}

func (b *buildRecorder) ImageBuild(_ context.Context, r io.Reader, opts build.ImageBuildOptions) (build.ImageBuildResponse, error) {
	b.opts, b.context, b.files = opts, map[string]*tar.Header{}, map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return build.ImageBuildResponse{}, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return build.ImageBuildResponse{}, err
		}
		b.context[h.Name], b.files[h.Name] = h, string(data)
	}
	return build.ImageBuildResponse{Body: io.NopCloser(strings.NewReader(`{"stream":"Successfully built"}` + "\n"))}, nil
}

// copySources are the build-context paths the COPY lines of a Dockerfile read.
func copySources(dockerfile string) []string {
	var out []string
	for _, line := range strings.Split(dockerfile, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.EqualFold(f[0], "COPY") {
			continue
		}
		for _, arg := range f[1 : len(f)-1] {
			if !strings.HasPrefix(arg, "--") {
				out = append(out, arg)
			}
		}
	}
	return out
}

// Images built here used to carry org.opencontainers.image.version="dev": no build args
// reached Dockerfile.proxy's ARG VERSION.
func TestBuildImageProxyOptions(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "compass-proxy")
	if err := os.WriteFile(bin, []byte("\x7fELF static"), 0o755); err != nil {
		t.Fatal(err)
	}
	rec := &buildRecorder{}
	spec := ProxyImageSpec("compass-proxy:test", bin)
	if err := BuildImage(t.Context(), rec, spec); err != nil {
		t.Fatal(err)
	}
	if v := rec.opts.BuildArgs["VERSION"]; v == nil || *v != buildinfo.Version {
		t.Fatalf("VERSION build arg %v, want %q", v, buildinfo.Version)
	}
	if len(rec.opts.Tags) != 1 || rec.opts.Tags[0] != "compass-proxy:test" || rec.opts.Version != build.BuilderV1 || rec.opts.PullParent {
		t.Fatalf("options %+v", rec.opts)
	}
	if !strings.Contains(rec.files["Dockerfile"], "ARG VERSION") || rec.files["compass-proxy"] != "\x7fELF static" {
		t.Fatalf("context files: %v", rec.context)
	}
	// Every COPY of Dockerfile.proxy finds its source in the context, as in `make image`.
	for _, src := range copySources(rec.files["Dockerfile"]) {
		if rec.context[src] == nil && rec.context[src+"/"] == nil {
			t.Errorf("COPY %s: not in the build context (%d entries)", src, len(rec.context))
		}
	}
	if h := rec.context["run-compass/"]; h == nil || h.Typeflag != tar.TypeDir {
		t.Fatalf("run-compass/ is not a directory of the context: %+v", h)
	}
}

func TestBuildImageProbeHasNoBuildArgs(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(bin, []byte("probe"), 0o755); err != nil {
		t.Fatal(err)
	}
	rec := &buildRecorder{}
	if err := BuildImage(t.Context(), rec, ProbeImageSpec("probe:test", bin)); err != nil {
		t.Fatal(err)
	}
	if len(rec.opts.BuildArgs) != 0 || len(rec.context) != 2 {
		t.Fatalf("build args %v, context %v", rec.opts.BuildArgs, rec.context)
	}
	if got := copySources(rec.files["Dockerfile"]); len(got) != 1 || got[0] != "probe" {
		t.Fatalf("COPY sources %q", got)
	}
}
