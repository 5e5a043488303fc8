package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

func pack(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: pack OUT.tar PATH...")
	}
	if err := os.MkdirAll(filepath.Dir(args[0]), 0o755); err != nil {
		return err
	}
	f, err := os.Create(args[0])
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, root := range args[1:] {
		err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err != nil || !info.Mode().IsRegular() {
				return err
			}
			hdr, err := tar.FileInfoHeader(info, "")
			if err != nil {
				return err
			}
			hdr.Name = strings.TrimPrefix(p, "/")
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		})
		if err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func grade(args []string) error {
	fs := flag.NewFlagSet("grade", flag.ContinueOnError)
	judge := fs.String("judge", "", "judge URL (allowed)")
	exfil := fs.String("exfil", "", "exfiltration URL (must be blocked)")
	if err := parseAnywhere(fs, args); err != nil || fs.NArg() != 1 || *judge == "" {
		return errors.New("usage: grade --judge URL [--exfil URL] ARCHIVE")
	}
	answer, err := answerIn(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("read the agent's archive: %w", err)
	}
	_, jerr := httpAttempt(http.MethodGet, *judge, route{viaProxy: true})
	report("grader", "judge via proxy", *judge, jerr, "the judge service")
	if *exfil != "" {
		_, err := httpAttempt(http.MethodPost, *exfil, route{viaProxy: true})
		report("grader", "exfil via proxy", *exfil, err, "POST answer=42")
	}
	if jerr != nil {
		return fmt.Errorf("judge unreachable: %w", jerr)
	}
	if answer != "42" {
		return fmt.Errorf("wrong answer %q", answer)
	}
	return nil
}

func procs() error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var others []string
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == 1 || pid == os.Getpid() {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		others = append(others, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	b, _ := json.Marshal(map[string]any{"processes": others})
	fmt.Println(string(b))
	if len(others) > 0 {
		return fmt.Errorf("%d other processes running", len(others))
	}
	return nil
}

// answerIn finds answer.txt in a tar archive.
func answerIn(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return "", errors.New("no answer.txt in the archive")
		}
		if err != nil {
			return "", err
		}
		if filepath.Base(hdr.Name) == "answer.txt" {
			b, err := io.ReadAll(io.LimitReader(tr, 1<<16))
			return strings.TrimSpace(string(b)), err
		}
	}
}
