package counter

import "testing"

func TestChecker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replies []Reply
		failed  []int // requests that failed before reply i
		wantErr int   // index of the reply that must fail, -1 none
	}{
		{"counts on", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "a", Disk: 6}}, nil, -1},
		{"goes back", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 5, BootID: "a", Disk: 5}}, nil, 1},
		{"skips", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 7, BootID: "a", Disk: 7}}, nil, 1},
		{"skips one unanswered", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 7, BootID: "a", Disk: 7}}, []int{1}, -1},
		{"skips beyond unanswered", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 8, BootID: "a", Disk: 8}}, []int{1}, 1},
		{"reboots", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "b", Disk: 6}}, nil, 1},
		{"reboots, said once", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "b", Disk: 6}, {Count: 7, BootID: "b", Disk: 7}}, nil, 1},
		{"disk behind", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "a", Disk: 5}}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Checker
			for i, r := range tc.replies {
				for _, f := range tc.failed {
					if f == i {
						c.Failed()
					}
				}
				err := c.Check(r)
				if (err != nil) != (i == tc.wantErr) {
					t.Fatalf("reply %d (%+v): %v", i, r, err)
				}
			}
		})
	}
}
