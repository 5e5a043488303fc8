package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller/docker"
)

func newEnvImageCommand(f *envFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image build | save FILE | load FILE",
		Short: "Build the sidecar (and probe) images offline from static binaries, export and import them",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newImageBuildCommand(f), newImageSaveCommand(f), newImageLoadCommand(f))
	return cmd
}

func newImageBuildCommand(f *envFlags) *cobra.Command {
	var binary, probeBinary string
	var probe bool
	build := &cobra.Command{
		Use:   "build [--binary PATH] [--probe [--probe-binary PATH]]",
		Short: "Build the compass-proxy image FROM scratch from the static binary (no registry needed)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, cli, done, err := f.connect()
			if err != nil {
				return err
			}
			defer done()
			specs := []docker.ImageSpec{docker.ProxyImageSpec(p.Config().ProxyImage, besideSelf(binary, "compass-proxy"))}
			if probe {
				specs = append(specs, docker.ProbeImageSpec(p.Config().ProbeImage, besideSelf(probeBinary, "probe")))
			}
			built := []string{}
			for _, s := range specs {
				if err := docker.BuildImage(cmd.Context(), cli, s); err != nil {
					return err
				}
				built = append(built, s.Tag)
			}
			return f.print(cmd.OutOrStdout(), map[string]any{"built": built}, func(w io.Writer) {
				for _, t := range built {
					fmt.Fprintf(w, "built %s\n", t)
				}
			})
		},
	}
	build.Flags().StringVar(&binary, "binary", "", "static compass-proxy binary (default: next to compassctl)")
	build.Flags().BoolVar(&probe, "probe", false, "also build the verify probe image")
	build.Flags().StringVar(&probeBinary, "probe-binary", "", "static probe binary (default: next to compassctl)")
	return build
}

func newImageSaveCommand(f *envFlags) *cobra.Command {
	var probe bool
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Export the sidecar and probe images to a tar archive",
		Args:  exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, cli, done, err := f.connect()
			if err != nil {
				return err
			}
			defer done()
			tags := []string{p.Config().ProxyImage}
			if probe {
				tags = append(tags, p.Config().ProbeImage)
			}
			if err := docker.SaveImages(cmd.Context(), cli, args[0], tags...); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), map[string]any{"saved": tags, "file": args[0]}, func(w io.Writer) {
				fmt.Fprintf(w, "saved %v to %s\n", tags, args[0])
			})
		},
	}
	save.Flags().BoolVar(&probe, "probe", false, "include the probe image")
	return save
}

func newImageLoadCommand(f *envFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "load FILE",
		Short: "Import images exported by `image save` (air-gapped hosts)",
		Args:  exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fi, err := os.Stat(args[0]); err != nil {
				return usageError{fmt.Errorf("load %q: %w", args[0], err)}
			} else if fi.IsDir() {
				return usageError{fmt.Errorf("load %q: is a directory; give the tar archive `image save` wrote", args[0])}
			}
			cli, err := docker.NewClient()
			if err != nil {
				return err
			}
			defer cli.Close()
			if err := docker.LoadImages(cmd.Context(), cli, args[0]); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), map[string]any{"loaded": args[0]}, func(w io.Writer) {
				fmt.Fprintf(w, "loaded %s\n", args[0])
			})
		},
	}
}

// besideSelf defaults a binary path to the named file next to the running compassctl
// (make build puts them all in bin/).
func besideSelf(path, name string) string {
	if path != "" {
		return path
	}
	self, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(self), name)
}
