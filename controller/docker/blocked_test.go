package docker

import (
	"reflect"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
)

func TestMergeBlocked(t *testing.T) {
	a := func(host string, count, over uint64) controller.BlockedTarget {
		return controller.BlockedTarget{Host: host, Port: 443, Type: "connect", Reason: "not_allowed", Count: count, Overcount: over}
	}
	dnsA := controller.BlockedTarget{Host: "a.test", Type: "dns", Reason: "not_allowed", Count: 9}
	tests := []struct {
		name           string
		earlier, later controller.BlockedSummary
		want           controller.BlockedSummary
	}{
		{
			name:    "nothing blocked in the interim",
			earlier: controller.BlockedSummary{Generation: 3, Total: 5, Top: []controller.BlockedTarget{a("a.test", 5, 0)}},
			later:   controller.BlockedSummary{Generation: 4},
			want:    controller.BlockedSummary{Generation: 3, Total: 5, Top: []controller.BlockedTarget{a("a.test", 5, 0)}},
		},
		{
			name:    "the same destination adds up and moves up",
			earlier: controller.BlockedSummary{Generation: 3, Total: 7, Top: []controller.BlockedTarget{a("a.test", 4, 0), a("b.test", 3, 1)}},
			later:   controller.BlockedSummary{Generation: 4, Total: 2, Top: []controller.BlockedTarget{a("b.test", 2, 1)}},
			want:    controller.BlockedSummary{Generation: 3, Total: 9, Top: []controller.BlockedTarget{a("b.test", 5, 2), a("a.test", 4, 0)}},
		},
		{
			name:    "another type or reason is another destination; ties keep the earlier first",
			earlier: controller.BlockedSummary{Generation: 1, Total: 9, Top: []controller.BlockedTarget{a("a.test", 9, 0)}},
			later:   controller.BlockedSummary{Generation: 2, Total: 9, Top: []controller.BlockedTarget{dnsA}},
			want:    controller.BlockedSummary{Generation: 1, Total: 18, Top: []controller.BlockedTarget{a("a.test", 9, 0), dnsA}},
		},
		{
			name:    "a destination of the later list only joins in its place",
			earlier: controller.BlockedSummary{Generation: 1, Total: 5, Top: []controller.BlockedTarget{a("a.test", 3, 0), a("b.test", 2, 0)}},
			later:   controller.BlockedSummary{Generation: 2, Total: 4, Top: []controller.BlockedTarget{a("c.test", 4, 0)}},
			want:    controller.BlockedSummary{Generation: 1, Total: 9, Top: []controller.BlockedTarget{a("c.test", 4, 0), a("a.test", 3, 0), a("b.test", 2, 0)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			earlierTop := append([]controller.BlockedTarget(nil), tc.earlier.Top...)
			got := mergeBlocked(tc.earlier, tc.later)
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("mergeBlocked =\n%+v\nwant\n%+v", *got, tc.want)
			}
			if !reflect.DeepEqual(tc.earlier.Top, earlierTop) {
				t.Errorf("mergeBlocked changed its argument's list: %+v", tc.earlier.Top)
			}
		})
	}
}
