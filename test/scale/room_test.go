package scale

import "testing"

func TestRoomFor(t *testing.T) {
	open := func(name string, members, vcpus int) nodeRoom {
		return nodeRoom{Name: name, Open: true, MaxMembers: 4, MaxVCPUs: 8, Members: members, VCPUs: vcpus}
	}
	full := open("full", 4, 4)
	cpuBound := open("cpu-bound", 1, 7)
	dead := open("dead", 0, 0)
	dead.Open = false
	for _, tc := range []struct {
		name  string
		vm    waitingVM
		nodes []nodeRoom
		room  bool
	}{
		{"no nodes", waitingVM{VCPUs: 1}, nil, false},
		{"a pair needs two nodes", waitingVM{VCPUs: 1}, []nodeRoom{open("a", 0, 0), full}, false},
		{"a pair fits on two", waitingVM{VCPUs: 1}, []nodeRoom{open("a", 0, 0), open("b", 3, 7)}, true},
		{"a dead node has no room", waitingVM{VCPUs: 1}, []nodeRoom{open("a", 0, 0), dead}, false},
		{"vCPUs bind before members", waitingVM{VCPUs: 2}, []nodeRoom{open("a", 0, 0), cpuBound}, false},
		{"a secondary never beside its primary", waitingVM{VCPUs: 1, PrimaryNode: "a"}, []nodeRoom{open("a", 1, 1), full}, false},
		{"a secondary fits elsewhere", waitingVM{VCPUs: 1, PrimaryNode: "a"}, []nodeRoom{open("a", 1, 1), cpuBound}, true},
		{"a larger VM's secondary", waitingVM{VCPUs: 8, PrimaryNode: "a"}, []nodeRoom{open("a", 1, 8), open("b", 0, 0)}, true},
	} {
		if got := roomFor(tc.vm, tc.nodes); (got != "") != tc.room {
			t.Errorf("%s: room %q, want room %v", tc.name, got, tc.room)
		}
	}
}
