package colo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// fakeQEMU is a QMP monitor that answers every command with success, except those refuse names
// (command -> QEMU's error), and records the commands. Its machine's devices are devices (id ->
// netdev, "" for a device that is not a NIC); none given, one NIC, e0, on netdev hn0.
type fakeQEMU struct {
	refuse  map[string]string
	devices map[string]string
	// blocks are the block devices query-block lists, with a medium of sizes[device] bytes
	// where sizes has one.
	blocks []string
	sizes  map[string]int64
	// replies are canned returns of commands (by name).
	replies map[string]any
	// events are sent, each once, after the reply to the command that names them.
	events map[string][]map[string]any
	// hang names the commands that get no reply, as from a QEMU whose main loop is stuck.
	hang map[string]bool
	// failFirst refuses the first n calls of a command (a failure that passes).
	failFirst map[string]int

	mu      sync.Mutex
	cmds    []string
	args    []map[string]any // the arguments of each command, in order
	objects []map[string]any // the arguments of each object-add
}

func (f *fakeQEMU) conn(t *testing.T) *qmp.Conn {
	t.Helper()
	if f.devices == nil {
		f.devices = map[string]string{"e0": "hn0"}
	}
	client, server := net.Pipe()
	go func() {
		w := json.NewEncoder(server)
		_ = w.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
		r := bufio.NewScanner(server)
		for r.Scan() {
			var req struct {
				Execute   string         `json:"execute"`
				ID        string         `json:"id"`
				Arguments map[string]any `json:"arguments"`
			}
			if json.Unmarshal(r.Bytes(), &req) != nil {
				return
			}
			f.mu.Lock()
			f.cmds = append(f.cmds, req.Execute)
			f.args = append(f.args, req.Arguments)
			if req.Execute == "object-add" {
				f.objects = append(f.objects, req.Arguments)
			}
			f.mu.Unlock()
			if f.hang[req.Execute] {
				continue
			}
			reply := map[string]any{"id": req.ID, "return": map[string]any{}}
			f.mu.Lock()
			transient := f.failFirst[req.Execute] > 0
			if transient {
				f.failFirst[req.Execute]--
			}
			f.mu.Unlock()
			switch {
			case transient:
				reply = map[string]any{"id": req.ID, "error": map[string]any{"class": "GenericError", "desc": "a failure that passes"}}
			case f.refuse[req.Execute] != "":
				reply = map[string]any{"id": req.ID, "error": map[string]any{"class": "GenericError", "desc": f.refuse[req.Execute]}}
			case req.Execute == "qom-list":
				list := []map[string]string{{"name": "type", "type": "string"}}
				for id := range f.devices {
					list = append(list, map[string]string{"name": id, "type": "child<some-device>"})
				}
				reply["return"] = list
			case req.Execute == "qom-get":
				path, _ := req.Arguments["path"].(string)
				if nd := f.devices[strings.TrimPrefix(path, "/machine/peripheral/")]; nd != "" && req.Arguments["property"] == "netdev" {
					reply["return"] = nd
				} else {
					reply = map[string]any{"id": req.ID, "error": map[string]any{"class": "GenericError", "desc": fmt.Sprintf("Property '%v' not found", req.Arguments["property"])}}
				}
			case f.replies[req.Execute] != nil:
				reply["return"] = f.replies[req.Execute]
			case req.Execute == "human-monitor-command":
				reply["return"] = ""
			case req.Execute == "query-block":
				var list []map[string]any
				for _, b := range f.blocks {
					dev := map[string]any{"device": b}
					if n, ok := f.sizes[b]; ok {
						dev["inserted"] = map[string]any{"image": map[string]any{"virtual-size": n}}
					}
					list = append(list, dev)
				}
				reply["return"] = list
			}
			_ = w.Encode(reply)
			f.mu.Lock()
			evs := f.events[req.Execute]
			delete(f.events, req.Execute)
			f.mu.Unlock()
			for _, ev := range evs {
				_ = w.Encode(ev)
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := qmp.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// calls are the commands with their arguments, as "cmd arg=value ..." (arguments sorted).
func (f *fakeQEMU) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for i, c := range f.cmds {
		keys := make([]string, 0, len(f.args[i]))
		for k := range f.args[i] {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		line := c
		for _, k := range keys {
			line += fmt.Sprintf(" %s=%v", k, f.args[i][k])
		}
		out = append(out, line)
	}
	return out
}

func (f *fakeQEMU) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.cmds...)
}

// TestAQEMUWithoutRAMAheadIsRefusedFirst: a QEMU without lockstep's x-colo-ram-ahead refuses the
// capability (QEMU 10.2's own words below). PrimaryCapabilities, which a protection runs first, says
// what to do; a QEMU that takes it gets it again in StartPrimary's COLO start.
func TestAQEMUWithoutRAMAheadIsRefusedFirst(t *testing.T) {
	ctx := context.Background()
	tuning := Tuning{Checkpoint: 2 * time.Second, CompareTimeout: 100 * time.Millisecond, RAMAhead: true}
	f := &fakeQEMU{refuse: map[string]string{"migrate-set-capabilities": "Parameter 'capability' does not accept value 'x-colo-ram-ahead'"}}
	_, err := PrimaryCapabilities(ctx, f.conn(t), tuning)
	if err == nil || !strings.Contains(err.Error(), "--colo-ram-ahead=false") {
		t.Fatalf("PrimaryCapabilities: %v, want an error that names --colo-ram-ahead=false", err)
	}
	if _, err := PrimaryCapabilities(ctx, f.conn(t), Tuning{}); err == nil || strings.Contains(err.Error(), "--colo-ram-ahead") {
		t.Fatalf("PrimaryCapabilities without RAMAhead, refused: %v, want QEMU's error alone", err)
	}

	f = &fakeQEMU{}
	if _, err := PrimaryCapabilities(ctx, f.conn(t), tuning); err != nil {
		t.Fatal(err)
	}
	if err := StartPrimary(ctx, f.conn(t), Sockets{Dir: t.TempDir()}, tuning, false, 1); err != nil {
		t.Fatal(err)
	}
	cmds := f.commands()
	if n := slices.Index(cmds, "migrate-set-capabilities"); n < 0 || !slices.Contains(cmds[n+1:], "migrate-set-capabilities") || cmds[len(cmds)-1] != "migrate" {
		t.Fatalf("the commands: %v, want the capabilities set by both, and the migration last", cmds)
	}
}

// TestEveryPacketFilterCarriesTheVirtioNetHeader: the primary's filters and colo-compare, and the
// secondary's, all say vnet_hdr_support (a virtio NIC's packets parse only so, and the two ends of
// each chardev must agree on its framing).
func TestEveryPacketFilterCarriesTheVirtioNetHeader(t *testing.T) {
	f := &fakeQEMU{}
	s := Sockets{Dir: t.TempDir()}
	if err := StartPrimary(context.Background(), f.conn(t), s, Tuning{Checkpoint: time.Second, CompareTimeout: time.Second}, false, 1); err != nil {
		t.Fatal(err)
	}
	packets := 0
	for _, o := range f.objects {
		typ, _ := o["qom-type"].(string)
		if !strings.HasPrefix(typ, "filter-") && typ != "colo-compare" {
			continue
		}
		packets++
		if o["vnet_hdr_support"] != true {
			t.Errorf("the primary's %s %v has no vnet_hdr_support", typ, o["id"])
		}
	}
	if packets != 4 {
		t.Errorf("the primary added %d filters and comparisons, want 4 (m0, redire0, redire1, colo-compare)", packets)
	}
	args := SecondaryNetArgs(s, "hn0")
	filters := 0
	for i, a := range args {
		if i > 0 && args[i-1] == "-object" {
			filters++
			if !strings.Contains(a, ",vnet_hdr_support=on") {
				t.Errorf("the secondary's %s has no vnet_hdr_support", a)
			}
		}
	}
	if filters != 3 {
		t.Errorf("the secondary has %d filters, want 3 (f1, f2, rew0)", filters)
	}
}

// TestEveryDiskHasItsReplicationChain: a VM with two disks (colo-disk0, colo-disk1). The engine
// finds them in QEMU, with their sizes; the secondary exports a replica of each; the primary resyncs each into its
// replica and adds a replication child to each quorum; going alone drops both.
func TestEveryDiskHasItsReplicationChain(t *testing.T) {
	ctx := context.Background()
	s := Sockets{Dir: t.TempDir()}
	f := &fakeQEMU{blocks: []string{"colo-disk0", "colo-disk1", "parent0", "parent1", "pflash0"},
		sizes: map[string]int64{"colo-disk0": 3044 << 20, "colo-disk1": 2 << 30, "parent0": 3 << 30}}
	q := f.conn(t)
	sizes, err := ReplicatedDisks(ctx, q)
	if err != nil || len(sizes) != 2 || sizes[0] != 3044<<20 || sizes[1] != 2<<30 {
		t.Fatalf("ReplicatedDisks: %v, %v; want the two quorums' sizes", sizes, err)
	}
	n := len(sizes)
	if err := StartSecondary(ctx, q, s, n); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := ResyncDisk(ctx, q, s, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := StartPrimary(ctx, q, s, Tuning{Checkpoint: time.Second, CompareTimeout: time.Second}, false, n); err != nil {
		t.Fatal(err)
	}
	if err := PrimaryGoAlone(ctx, q, n); err != nil {
		t.Fatal(err)
	}
	calls := strings.Join(f.calls(), "\n")
	for _, want := range []string{
		"nbd-server-add device=parent0 writable=true",
		"nbd-server-add device=parent1 writable=true",
		"drive-mirror device=colo-disk0 format=raw job-id=resync0 mode=existing sync=full target=nbd+unix:///parent0?socket=" + s.Path(StreamNBD),
		"drive-mirror device=colo-disk1 format=raw job-id=resync1 mode=existing sync=full target=nbd+unix:///parent1?socket=" + s.Path(StreamNBD),
		"file.export=parent0,node-name=replication0",
		"file.export=parent1,node-name=replication1",
		"x-blockdev-change node=replication0 parent=colo-disk0",
		"x-blockdev-change node=replication1 parent=colo-disk1",
		"x-blockdev-change child=children.1 parent=colo-disk0",
		"x-blockdev-change child=children.1 parent=colo-disk1",
		"command-line=drive_del replication1",
	} {
		if !strings.Contains(calls, want) {
			t.Errorf("no %q among the commands:\n%s", want, calls)
		}
	}

	f = &fakeQEMU{blocks: []string{"drive-ua-rootdisk"}}
	if _, err := ReplicatedDisks(ctx, f.conn(t)); err == nil || !strings.Contains(err.Error(), "colo-disk0") {
		t.Fatalf("a QEMU without replicated disks: %v, want an error that names colo-disk0", err)
	}
}

// TestAQEMUWithoutTheCrossedWaitProtectsWithout: colo-compare's object-add refuses a member its
// QAPI schema lacks, after the protection's disk resync. PrimaryCapabilities, which runs first,
// looks x-crossed-timeout up in the schema and leaves the crossed wait out for a QEMU without it
// (a launcher still on an older lockstep-qemu image is protected as before), and asks nothing of
// a QEMU when the wait is off. StartPrimary sets the wait where the QEMU has it, and scans for old
// packets every half of it.
func TestAQEMUWithoutTheCrossedWaitProtectsWithout(t *testing.T) {
	ctx := context.Background()
	tuning := Tuning{Checkpoint: 2 * time.Second, CompareTimeout: 100 * time.Millisecond, CrossedWait: 20 * time.Millisecond}
	compareObject := func(f *fakeQEMU) map[string]any {
		for _, o := range f.objects {
			if o["qom-type"] == "colo-compare" {
				return o
			}
		}
		return nil
	}
	without := []map[string]any{{"name": "123", "meta-type": "object", "members": []map[string]any{{"name": "compare_timeout", "type": "int"}}}}
	f := &fakeQEMU{replies: map[string]any{"query-qmp-schema": without}}
	got, err := PrimaryCapabilities(ctx, f.conn(t), tuning)
	if err != nil || got.CrossedWait != 0 || got.CompareTimeout != tuning.CompareTimeout {
		t.Fatalf("PrimaryCapabilities of a QEMU without the crossed wait: %+v, %v; want the tuning without it", got, err)
	}
	if err := StartPrimary(ctx, f.conn(t), Sockets{Dir: t.TempDir()}, got, false, 1); err != nil {
		t.Fatal(err)
	}
	if c := compareObject(f); c == nil || c["x-crossed-timeout"] != nil || c["expired_scan_cycle"] != float64(50) {
		t.Fatalf("colo-compare: %v, want no x-crossed-timeout and expired_scan_cycle 50", c)
	}

	off := tuning
	off.CrossedWait = 0
	f = &fakeQEMU{replies: map[string]any{"query-qmp-schema": without}}
	if _, err := PrimaryCapabilities(ctx, f.conn(t), off); err != nil || slices.Contains(f.commands(), "query-qmp-schema") {
		t.Fatalf("PrimaryCapabilities with the crossed wait off: %v after %v, want no error and no look at the schema", err, f.commands())
	}

	with := append(without, map[string]any{"name": "124", "meta-type": "object", "members": []map[string]any{{"name": "x-crossed-timeout", "type": "int"}}})
	f = &fakeQEMU{replies: map[string]any{"query-qmp-schema": with}}
	if got, err = PrimaryCapabilities(ctx, f.conn(t), tuning); err != nil || got != tuning {
		t.Fatalf("PrimaryCapabilities: %+v, %v; want %+v", got, err, tuning)
	}
	if err := StartPrimary(ctx, f.conn(t), Sockets{Dir: t.TempDir()}, got, false, 1); err != nil {
		t.Fatal(err)
	}
	if c := compareObject(f); c["x-crossed-timeout"] != float64(20) || c["expired_scan_cycle"] != float64(10) || c["compare_timeout"] != float64(100) {
		t.Fatalf("colo-compare: %v, want x-crossed-timeout 20, expired_scan_cycle 10 and compare_timeout 100", c)
	}
}
