package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/docker/api/types/build"

	compassegress "github.com/compass-egress/compass-egress"
	"github.com/compass-egress/compass-egress/internal/buildinfo"
)

// ImageSpec describes a FROM-scratch image made of one static binary.
type ImageSpec struct {
	Tag    string   // e.g. compass-proxy:latest
	Binary string   // path of the static binary on this host
	Name   string   // file name inside the image (/Name)
	User   string   // USER line ("" for root)
	Cmd    []string // default CMD
	// Recipe is a complete Dockerfile to use instead of the generated one; its COPY must
	// take the binary as Name.
	Recipe string
	// BuildArgs are the recipe's ARG values (docker build --build-arg).
	BuildArgs map[string]string
	// EmptyDirs are empty directories of the build context, for a recipe to COPY into
	// place (scratch has no mkdir).
	EmptyDirs []string
}

// Dockerfile is the build recipe of spec: the binary alone on an empty filesystem.
func (s ImageSpec) Dockerfile() string {
	if s.Recipe != "" {
		return s.Recipe
	}
	var b strings.Builder
	b.WriteString("FROM scratch\n")
	fmt.Fprintf(&b, "COPY %s /%s\n", s.Name, s.Name)
	if s.User != "" {
		fmt.Fprintf(&b, "USER %s\n", s.User)
	}
	ep, _ := json.Marshal([]string{"/" + s.Name})
	fmt.Fprintf(&b, "ENTRYPOINT %s\n", ep)
	if len(s.Cmd) > 0 {
		cmd, _ := json.Marshal(s.Cmd)
		fmt.Fprintf(&b, "CMD %s\n", cmd)
	}
	return b.String()
}

// ProxyImageSpec is the compass-proxy sidecar image, built from Dockerfile.proxy itself
// (non-root user, OCI labels, HEALTHCHECK, /run/compass), so every build path makes the
// same image as `make image`: its version label is this program's version, as the
// Makefile passes VERSION, not the recipe's "dev".
func ProxyImageSpec(tag, binary string) ImageSpec {
	return ImageSpec{Tag: tag, Binary: binary, Name: "compass-proxy", Recipe: compassegress.ProxyDockerfile,
		BuildArgs: map[string]string{"VERSION": buildinfo.Version}, EmptyDirs: []string{"run-compass"}}
}

// ProbeImageSpec is the verify probe image.
func ProbeImageSpec(tag, binary string) ImageSpec {
	return ImageSpec{Tag: tag, Binary: binary, Name: "probe", Cmd: []string{"sleep"}}
}

// BuildImage builds spec offline: the build context holds only the binary, the
// Dockerfile and spec's empty directories, and FROM scratch needs no pull.
func BuildImage(ctx context.Context, api dockerAPI, spec ImageSpec) error {
	bin, err := os.ReadFile(spec.Binary)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range spec.EmptyDirs {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return fmt.Errorf("image: build context: %w", err)
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{{"Dockerfile", 0o644, []byte(spec.Dockerfile())}, {spec.Name, 0o755, bin}}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return fmt.Errorf("image: build context: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("image: build context: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("image: build context: %w", err)
	}
	args := map[string]*string{}
	for k, v := range spec.BuildArgs {
		args[k] = &v
	}
	resp, err := api.ImageBuild(ctx, &buf, build.ImageBuildOptions{
		Tags: []string{spec.Tag}, Remove: true, ForceRemove: true, PullParent: false, Version: build.BuilderV1,
		BuildArgs: args,
	})
	if err != nil {
		return fmt.Errorf("image: build %s: %w", spec.Tag, err)
	}
	defer resp.Body.Close()
	return buildStreamError(resp.Body, spec.Tag)
}

// buildStreamError reads the JSON progress stream of a build and returns its error.
func buildStreamError(r io.Reader, tag string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var msg struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &msg) == nil && msg.Error != "" {
			return fmt.Errorf("image: build %s: %s", tag, msg.Error)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("image: build %s: %w", tag, err)
	}
	return nil
}

// SaveImages writes the images as a tar archive (docker save format) to path.
func SaveImages(ctx context.Context, api dockerAPI, path string, tags ...string) error {
	rc, err := api.ImageSave(ctx, tags)
	if err != nil {
		return fmt.Errorf("image: save: %w", err)
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".compass-image-*")
	if err != nil {
		return fmt.Errorf("image: save: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, rc); err != nil {
		tmp.Close()
		return fmt.Errorf("image: save: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("image: save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("image: save: %w", err)
	}
	return nil
}

// LoadImages imports an archive written by SaveImages (or docker save).
func LoadImages(ctx context.Context, api dockerAPI, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("image: load: %w", err)
	}
	defer f.Close()
	resp, err := api.ImageLoad(ctx, f)
	if err != nil {
		return fmt.Errorf("image: load %s: %w", path, err)
	}
	defer resp.Body.Close()
	return buildStreamError(resp.Body, path)
}
