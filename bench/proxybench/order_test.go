package proxybench

import (
	"slices"
	"testing"
)

// Over one full design every target runs right after every other equally often, and
// in every position equally often; a rotation of one order fails both.
func TestRoundOrderIsBalanced(t *testing.T) {
	for n := 1; n <= 8; n++ {
		rows, times := n, 1
		if n%2 == 1 {
			rows, times = 2*n, 2
		}
		after := map[[2]int]int{}
		at := map[[2]int]int{}
		for round := 1; round <= rows; round++ {
			order := roundOrder(n, round)
			if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, identity(n)) {
				t.Fatalf("n=%d round %d: order %v is not a permutation of 0..%d", n, round, order, n-1)
			}
			if !slices.Equal(order, roundOrder(n, round+rows)) {
				t.Errorf("n=%d: round %d and round %d differ; the design should repeat", n, round, round+rows)
			}
			for i, target := range order {
				at[[2]int{target, i}]++
				if i > 0 {
					after[[2]int{order[i-1], target}]++
				}
			}
		}
		for a := range n {
			for b := range n {
				if a != b && after[[2]int{a, b}] != times {
					t.Errorf("n=%d: target %d ran right after %d in %d of %d rounds, want %d", n, b, a, after[[2]int{a, b}], rows, times)
				}
				if at[[2]int{a, b}] != times {
					t.Errorf("n=%d: target %d ran in position %d in %d of %d rounds, want %d", n, a, b, at[[2]int{a, b}], rows, times)
				}
			}
		}
	}
}

func identity(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
