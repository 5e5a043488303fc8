package proxybench

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // reversed: Percentile must sort
	}
	tests := []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single", ms(7), 99, 7 * time.Millisecond},
		{"median of odd count", ms(3, 1, 2), 50, 2 * time.Millisecond},
		{"median of even count is the lower middle", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p100 is the maximum", ms(hundred...), 100, 100 * time.Millisecond},
		{"p1 of 100", ms(hundred...), 1, 1 * time.Millisecond},
		{"tiny p is the minimum", ms(5, 9), 0.001, 5 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]time.Duration(nil), tt.samples...)
			if got := Percentile(tt.samples, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.samples, tt.p, got, tt.want)
			}
			for i := range before {
				if before[i] != tt.samples[i] {
					t.Fatalf("Percentile reordered its input")
				}
			}
		})
	}
}

func TestMedian(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		in   []float64
		want float64
	}{
		{"odd", []float64{5, 1, 3}, 3},
		{"even averages the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"NaNs ignored", []float64{nan, 10, nan, 20, 30}, 20},
		{"only NaN", []float64{nan}, nan},
		{"empty", nil, nan},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Median(tt.in)
			if got != tt.want && !(math.IsNaN(got) && math.IsNaN(tt.want)) {
				t.Errorf("Median(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
