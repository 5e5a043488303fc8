package controller

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// PrepareOutputs decides, before anything starts, what each task does with its output
// directory: a fresh run replaces an earlier record; --resume continues, skips finished
// tasks, or refuses (every refusal is reported and nothing runs).
func PrepareOutputs(out string, tasks []TaskRun, resume bool, p Provider) ([]TaskRun, map[string]*Record, []string, error) {
	var (
		run     []TaskRun
		prevs   = map[string]*Record{}
		skipped []string
		errs    []error
	)
	for _, t := range tasks {
		dir := filepath.Join(out, t.ID)
		_, statErr := os.Stat(filepath.Join(dir, RecordFile))
		hasRecord := statErr == nil
		switch {
		case !hasRecord:
			run = append(run, t)
		case !resume:
			// Only a directory that holds a record is ours to clear.
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, fmt.Errorf("run: clear %s: %w", dir, err))
			}
			run = append(run, t)
		default:
			prev, err := ReadRecord(dir)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if Finished(prev) {
				skipped = append(skipped, t.ID)
				continue
			}
			if _, err := ResumeFrom(prev, t, p); err != nil {
				errs = append(errs, err)
				continue
			}
			prevs[t.ID] = prev
			run = append(run, t)
		}
	}
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return nil, nil, nil, errors.New(strings.Join(msgs, "\n"))
	}
	return run, prevs, skipped, nil
}
