package docker

import (
	"sort"

	"github.com/compass-egress/compass-egress/adminapi"
)

// mergeBlocked adds later, the summary of the generation that followed earlier's, to
// earlier: one phase's blocked attempts that the sidecar counted under two generations
// (a switch's no-network interim, which counts to the phase the switch ended). The
// generation stays earlier's; a destination in both lists has its counts summed; the
// list holds every destination of both, in the sidecar's order: most tried first.
func mergeBlocked(earlier, later adminapi.BlockedSummary) *adminapi.BlockedSummary {
	out := earlier
	out.Total += later.Total
	out.Top = append([]adminapi.BlockedTarget(nil), earlier.Top...)
	at := make(map[adminapi.BlockedTarget]int, len(out.Top))
	for i, t := range out.Top {
		at[t.Destination()] = i
	}
	for _, t := range later.Top {
		if i, ok := at[t.Destination()]; ok {
			out.Top[i].Count += t.Count
			out.Top[i].Overcount += t.Overcount
			continue
		}
		out.Top = append(out.Top, t)
	}
	sort.SliceStable(out.Top, func(i, j int) bool { return out.Top[i].Count > out.Top[j].Count })
	return &out
}
