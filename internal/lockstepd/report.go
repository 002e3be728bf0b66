package lockstepd

import (
	"encoding/json"
	"reflect"
	"strings"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// sidePatch is a side's report as a JSON merge patch of the status's side: every field of it,
// those that are empty now as null. A report is the side as it is now, but a merge patch merges
// into what was there, and the API's omitempty fields leave out false, 0 and "": without the
// nulls, a secondary that restarted and reports itself unsynchronized, or a link that went down,
// would keep the "synchronized: true" or "connected: true" of an earlier report, and the operator
// would take a member that no longer holds the pair's state for one that does.
func sidePatch(side ftv1.SideStatus) (map[string]any, error) {
	raw, err := json.Marshal(side)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	t := reflect.TypeOf(side)
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if _, ok := m[name]; !ok {
			m[name] = nil
		}
	}
	return m, nil
}
