package proxybench

// roundOrder is the order in which round (1-based) runs n targets: a row of a
// Williams design. Rotating one order from round to round would keep every target's
// cyclic neighbours, so the same target would run right after the same one in most
// rounds (after direct, whose set-ups leave the most sockets in TIME_WAIT and the most
// conntrack entries behind). In a Williams design every target runs right after every
// other equally often: once in n rounds when n is even, twice in 2n rounds when n is
// odd (the rows and their reverses), and every target runs in every position equally
// often.
func roundOrder(n, round int) []int {
	first := make([]int, n) // 0, 1, n-1, 2, n-2, ...
	for j, lo, hi := 1, 1, n-1; j < n; j++ {
		if j%2 == 1 {
			first[j], lo = lo, lo+1
		} else {
			first[j], hi = hi, hi-1
		}
	}
	rows := n
	if n%2 == 1 {
		rows = 2 * n
	}
	row := (round - 1) % rows
	order := make([]int, n)
	for j := range order {
		order[j] = (first[j] + row) % n
	}
	if row >= n {
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			order[i], order[j] = order[j], order[i]
		}
	}
	return order
}
