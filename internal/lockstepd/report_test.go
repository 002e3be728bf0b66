package lockstepd

import (
	"encoding/json"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// TestAReportReplacesTheSide applies a report as the API server applies a merge patch: the side
// it leaves is the report, not the report merged with an earlier one.
func TestAReportReplacesTheSide(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	before := ftv1.SideStatus{VMI: "vm-2", Node: "node-1", State: ftv1.SideReplicating, Epoch: 3, Synchronized: true,
		Connected: true, LastHeartbeatTime: &at, HeldOutputs: 4, Message: "streaming", Since: &at, ReportTime: at}
	// The same member after its lockstepd restarted: not synchronized, not connected, nothing held.
	later := metav1.NewTime(at.Add(time.Minute))
	now := ftv1.SideStatus{VMI: "vm-2", Node: "node-1", State: ftv1.SideFenced, ReportTime: later}

	doc, err := json.Marshal(map[string]any{"secondary": before})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := sidePatch(now)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(map[string]any{"secondary": sp})
	if err != nil {
		t.Fatal(err)
	}
	merged, err := jsonpatch.MergePatch(doc, patch)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Secondary ftv1.SideStatus `json:"secondary"`
	}
	if err := json.Unmarshal(merged, &got); err != nil {
		t.Fatal(err)
	}
	if got.Secondary.Synchronized || got.Secondary.Connected || got.Secondary.HeldOutputs != 0 || got.Secondary.Message != "" ||
		got.Secondary.Epoch != 0 || got.Secondary.LastHeartbeatTime != nil || got.Secondary.Since != nil ||
		got.Secondary.State != ftv1.SideFenced || !got.Secondary.ReportTime.Equal(&later) {
		t.Fatalf("after the report the side is %+v (%s), want exactly the report %+v", got.Secondary, merged, now)
	}

	// The old way, the side itself as the patch, keeps what the report left out: the fault.
	patch, _ = json.Marshal(map[string]any{"secondary": now})
	merged, _ = jsonpatch.MergePatch(doc, patch)
	_ = json.Unmarshal(merged, &got)
	if !got.Secondary.Synchronized {
		t.Fatalf("a merge patch of the side itself cleared synchronized; the test no longer shows why sidePatch exists")
	}
}
