package controller

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// WriteSummary prints the short human summary of a run: one row per task with its
// outcome, blocked attempts per phase and where its record is.
func WriteSummary(w io.Writer, outDir string, outcomes []Outcome) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tMODE\tSTATUS\tSTEPS\tBLOCKED BY PHASE\tRECORD")
	for _, o := range outcomes {
		rec := o.Record
		if rec == nil {
			fmt.Fprintf(tw, "%s\t-\tnot run\t-\t-\t%v\n", o.Task, o.Err)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", rec.Task, rec.EvaluationMode, rec.Status,
			stepCounts(rec), blockedByPhase(rec), filepath.Join(outDir, rec.Task, RecordFile))
	}
	tw.Flush()
	for _, o := range outcomes {
		if o.Err != nil {
			fmt.Fprintf(w, "%s: %v\n", o.Task, o.Err)
		}
		if o.Record == nil {
			continue
		}
		for _, e := range o.Record.Environments {
			if e.State == EnvRetained {
				fmt.Fprintf(w, "%s: retained %s: %s\n", o.Task, e.ID, e.Reach)
			}
		}
	}
}

func stepCounts(rec *Record) string {
	counts := map[StepStatus]int{}
	var order []StepStatus
	for _, s := range rec.Steps {
		if counts[s.Status] == 0 {
			order = append(order, s.Status)
		}
		counts[s.Status]++
	}
	parts := make([]string, len(order))
	for i, st := range order {
		parts[i] = fmt.Sprintf("%d %s", counts[st], st)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func blockedByPhase(rec *Record) string {
	var parts []string
	for _, b := range rec.Blocked {
		if b.Phase == "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %d", b.Phase, b.Summary.Total))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
