package docker

import (
	"reflect"
	"testing"

	"github.com/compass-egress/compass-egress/adminapi"
)

func TestMergeBlocked(t *testing.T) {
	a := func(host string, count, over uint64) adminapi.BlockedTarget {
		return adminapi.BlockedTarget{Host: host, Port: 443, Type: "connect", Reason: "not_allowed", Count: count, Overcount: over}
	}
	dnsA := adminapi.BlockedTarget{Host: "a.test", Type: "dns", Reason: "not_allowed", Count: 9}
	tests := []struct {
		name           string
		earlier, later adminapi.BlockedSummary
		want           adminapi.BlockedSummary
	}{
		{
			name:    "nothing blocked in the interim",
			earlier: adminapi.BlockedSummary{Generation: 3, Total: 5, Top: []adminapi.BlockedTarget{a("a.test", 5, 0)}},
			later:   adminapi.BlockedSummary{Generation: 4},
			want:    adminapi.BlockedSummary{Generation: 3, Total: 5, Top: []adminapi.BlockedTarget{a("a.test", 5, 0)}},
		},
		{
			name:    "the same destination adds up and moves up",
			earlier: adminapi.BlockedSummary{Generation: 3, Total: 7, Top: []adminapi.BlockedTarget{a("a.test", 4, 0), a("b.test", 3, 1)}},
			later:   adminapi.BlockedSummary{Generation: 4, Total: 2, Top: []adminapi.BlockedTarget{a("b.test", 2, 1)}},
			want:    adminapi.BlockedSummary{Generation: 3, Total: 9, Top: []adminapi.BlockedTarget{a("b.test", 5, 2), a("a.test", 4, 0)}},
		},
		{
			name:    "another type or reason is another destination; ties keep the earlier first",
			earlier: adminapi.BlockedSummary{Generation: 1, Total: 9, Top: []adminapi.BlockedTarget{a("a.test", 9, 0)}},
			later:   adminapi.BlockedSummary{Generation: 2, Total: 9, Top: []adminapi.BlockedTarget{dnsA}},
			want:    adminapi.BlockedSummary{Generation: 1, Total: 18, Top: []adminapi.BlockedTarget{a("a.test", 9, 0), dnsA}},
		},
		{
			name: "a transparent refusal read as another protocol is another destination",
			earlier: adminapi.BlockedSummary{Generation: 1, Total: 2, Top: []adminapi.BlockedTarget{
				{Host: "exfil.test", Port: 443, Type: "transparent", Reason: "not-allowlisted", Protocol: "tls", Count: 2}}},
			later: adminapi.BlockedSummary{Generation: 2, Total: 1, Top: []adminapi.BlockedTarget{
				{Host: "exfil.test", Port: 443, Type: "transparent", Reason: "not-allowlisted", Protocol: "tcp", Count: 1}}},
			want: adminapi.BlockedSummary{Generation: 1, Total: 3, Top: []adminapi.BlockedTarget{
				{Host: "exfil.test", Port: 443, Type: "transparent", Reason: "not-allowlisted", Protocol: "tls", Count: 2},
				{Host: "exfil.test", Port: 443, Type: "transparent", Reason: "not-allowlisted", Protocol: "tcp", Count: 1}}},
		},
		{
			name:    "a destination of the later list only joins in its place",
			earlier: adminapi.BlockedSummary{Generation: 1, Total: 5, Top: []adminapi.BlockedTarget{a("a.test", 3, 0), a("b.test", 2, 0)}},
			later:   adminapi.BlockedSummary{Generation: 2, Total: 4, Top: []adminapi.BlockedTarget{a("c.test", 4, 0)}},
			want:    adminapi.BlockedSummary{Generation: 1, Total: 9, Top: []adminapi.BlockedTarget{a("c.test", 4, 0), a("a.test", 3, 0), a("b.test", 2, 0)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			earlierTop := append([]adminapi.BlockedTarget(nil), tc.earlier.Top...)
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
