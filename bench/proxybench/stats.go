package proxybench

import (
	"cmp"
	"math"
	"slices"
)

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of samples, or the
// zero value for no samples. samples is not modified and must not hold NaNs.
func Percentile[T cmp.Ordered](samples []T, p float64) T {
	if len(samples) == 0 {
		var zero T
		return zero
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Median returns the middle value of vals (the mean of the two middle ones for an even
// count), ignoring NaNs; NaN when there is none.
func Median(vals []float64) float64 {
	var kept []float64
	for _, v := range vals {
		if !math.IsNaN(v) {
			kept = append(kept, v)
		}
	}
	if len(kept) == 0 {
		return math.NaN()
	}
	slices.Sort(kept)
	mid := len(kept) / 2
	if len(kept)%2 == 1 {
		return kept[mid]
	}
	return (kept[mid-1] + kept[mid]) / 2
}
