package adminapi

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

// The wire format, as docs/proxy.md shows it and run records keep it: every type
// encodes to exactly this JSON and decodes from it to the same value.
func TestWireFormat(t *testing.T) {
	prev := &BlockedSummary{Generation: 3, Total: 7, Top: []BlockedTarget{
		{Host: "b.test", Port: 443, Type: "connect", Reason: "not-allowlisted", Count: 5, Overcount: 2},
		{Host: "c.test", Type: "dns", Reason: "not-allowlisted", Count: 2},
	}}
	status := PolicyStatus{Generation: 4, Digest: allowA.Digest(), Mode: policy.ModeAllowlist, Policy: allowA, Task: "t1", Phase: "run"}
	statusJSON := `{"generation":4,"digest":"` + allowA.Digest() + `","mode":"allowlist","policy":{"network_mode":"allowlist","allowed_hosts":["a.test"]},"task":"t1","phase":"run"`
	blockedJSON := `{"generation":3,"total":7,"top":[{"host":"b.test","port":443,"type":"connect","reason":"not-allowlisted","count":5,"overcount":2},{"host":"c.test","port":0,"type":"dns","reason":"not-allowlisted","count":2}]}`
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"PolicyRequest", &PolicyRequest{Policy: policy.NoNetwork, Task: "t1", Phase: ""}, `{"policy":"no-network","task":"t1","phase":""}`},
		{"PolicyStatus", &status, statusJSON + `}`},
		{"ApplyResult", &ApplyResult{PolicyStatus: status, ClosedConnections: 2, PreviousBlocked: prev},
			statusJSON + `,"closed_connections":2,"previous_blocked":` + blockedJSON + `}`},
		{"ApplyResult of a first policy", &ApplyResult{PolicyStatus: status}, statusJSON + `,"closed_connections":0}`},
		{"BlockedSummary", prev, blockedJSON},
		{"ErrorBody", &ErrorBody{Error: "invalid policy; the running policy is unchanged", Errors: []string{"a: x"}},
			`{"error":"invalid policy; the running policy is unchanged","errors":["a: x"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(tc.v)
			if err != nil || string(got) != tc.want {
				t.Fatalf("encodes to %s (%v), want %s", got, err, tc.want)
			}
			back := reflect.New(reflect.TypeOf(tc.v).Elem())
			if err := json.Unmarshal([]byte(tc.want), back.Interface()); err != nil {
				t.Fatal(err)
			}
			// policy.Policy compares by its canonical form, not field by field.
			if again, _ := json.Marshal(back.Interface()); string(again) != tc.want {
				t.Errorf("decodes to %s, want %s", again, tc.want)
			}
		})
	}
}
