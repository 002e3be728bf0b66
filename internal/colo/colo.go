// Package colo drives QEMU's COLO (COarse-grained LOck-stepping) for one pair: the command lines
// of the primary and the secondary QEMU, and the QMP sequences that start COLO, make the
// secondary go live when the primary is lost, and let the primary go on alone when the secondary
// is lost. QEMU's COLO has no failure detection of its own: lockstepd decides when these run.
// The sequences follow QEMU's docs/COLO-FT.txt; the option sets were tried on QEMU 7.2 under TCG
// (DESIGN.md, COLO-NOTES.md).
package colo

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// Sockets are the Unix sockets, in one member's directory, through which its QEMU and its
// node's lockstepd exchange the COLO streams (internal/relay carries them between the nodes).
// Both members use the same names; which side listens depends on the side's role.
type Sockets struct{ Dir string }

// Stream names, as the relay routes them.
const (
	// StreamMigration carries the checkpoints (memory and device state) to the secondary, and
	// COLO's messages back; the primary's QEMU dials it.
	StreamMigration = "migration"
	// StreamNBD carries the primary's disk writes to the secondary's replication driver (and the
	// disk resync before COLO starts); the primary's QEMU dials it.
	StreamNBD = "nbd"
	// StreamMirror carries the primary's incoming packets to the secondary; the secondary's
	// QEMU dials it.
	StreamMirror = "mirror"
	// StreamCompare carries the secondary's outgoing packets to the primary's colo-compare; the
	// secondary's QEMU dials it.
	StreamCompare = "compare"
)

// Path is the socket of a stream.
func (s Sockets) Path(stream string) string { return filepath.Join(s.Dir, stream+".sock") }

// QMP is lockstepd's own QMP monitor of the member's QEMU: the launcher gives QEMU a second
// monitor there (its own stays the launcher's), and the engine attaches to it.
func (s Sockets) QMP() string { return filepath.Join(s.Dir, "qmp.sock") }

// maxSocketPath is the longest path a Unix socket can have on Linux (sun_path is 108 bytes, with
// its terminating NUL).
const maxSocketPath = 107

// Validate says whether every socket of the directory fits in a Unix socket's path.
func (s Sockets) Validate() error {
	if s.Dir == "" {
		return errors.New("the member has no socket directory")
	}
	for _, p := range []string{s.Path(StreamMigration), s.loop("out"), s.QMP()} {
		if len(p) > maxSocketPath {
			return fmt.Errorf("socket path %s is %d bytes, over the %d a Unix socket allows: use a shorter run directory", p, len(p), maxSocketPath)
		}
	}
	return nil
}

// loop is the socket of one of colo-compare's local loops on the primary.
func (s Sockets) loop(name string) string { return filepath.Join(s.Dir, "loop-"+name+".sock") }

// StartSecondary readies the secondary: COLO on, and its NBD server, which exports its replica of
// each of the primary's disks (disks of them) under the replica's name. It can be repeated (an
// earlier lockstepd may have run it before it restarted): what is already there counts as done.
func StartSecondary(ctx context.Context, q *qmp.Conn, s Sockets, disks int) error {
	steps := []step{colo(false), {"nbd-server-start", map[string]any{"addr": unixAddr(s.Path(StreamNBD))}}}
	for i := range disks {
		steps = append(steps, step{"nbd-server-add", map[string]any{"device": parentNode(i), "writable": true}})
	}
	for _, st := range steps {
		if err := q.Execute(ctx, st.cmd, st.args, nil); err != nil && !strings.Contains(err.Error(), "already") {
			return fmt.Errorf("secondary start, %s: %w", st.cmd, err)
		}
	}
	return nil
}

// colo turns COLO on. On a primary, ramAhead also turns on lockstep's x-colo-ram-ahead
// (hack/qemu/colo-send-ram-ahead.patch): the primary sends the pages its VM dirtied while the VM
// still runs, just before each checkpoint, so that the checkpoint's pause carries only the pages
// dirtied meanwhile.
func colo(ramAhead bool) step {
	caps := []map[string]any{{"capability": "x-colo", "state": true}}
	if ramAhead {
		caps = append(caps, map[string]any{"capability": "x-colo-ram-ahead", "state": true})
	}
	return step{"migrate-set-capabilities", map[string]any{"capabilities": caps}}
}

func unixAddr(path string) map[string]any {
	return map[string]any{"type": "unix", "data": map[string]any{"path": path}}
}

func chardev(id, path string, server bool) step {
	backend := map[string]any{"addr": unixAddr(path), "server": server}
	if server {
		backend["wait"] = false
	}
	return step{"chardev-add", map[string]any{"id": id, "backend": map[string]any{"type": "socket", "data": backend}}}
}

// PrimaryChardevs opens, on the primary, the sockets the secondary's packet streams arrive on and
// colo-compare's local loops (they stay open between protections).
func PrimaryChardevs(ctx context.Context, q *qmp.Conn, s Sockets) error {
	return run(ctx, q, "primary chardevs", false, []step{
		chardev("mirror0", s.Path(StreamMirror), true),
		chardev("compare1", s.Path(StreamCompare), true),
		chardev("compare0", s.loop("in"), true),
		chardev("compare0-0", s.loop("in"), false),
		chardev("compare_out", s.loop("out"), true),
		chardev("compare_out0", s.loop("out"), false),
	})
}

// resyncJob is the job that copies the primary's i-th disk into the secondary's replica.
func resyncJob(i int) string { return "resync" + strconv.Itoa(i) }

// ResyncDisk starts copying the primary's whole i-th disk into the secondary's replica (job
// resyncJob(i)). A job already running for it counts as started.
func ResyncDisk(ctx context.Context, q *qmp.Conn, s Sockets, i int) error {
	err := q.Execute(ctx, "drive-mirror", map[string]any{"device": DiskNode(i), "job-id": resyncJob(i),
		"target": "nbd+unix:///" + parentNode(i) + "?socket=" + s.Path(StreamNBD), "mode": "existing", "format": "raw", "sync": "full"}, nil)
	if err != nil && strings.Contains(err.Error(), "already") {
		return nil
	}
	return err
}

// ReplicatedDisks are the member's QEMU's replicated disks, each as its size in bytes: its
// quorums DiskNode(0), DiskNode(1), ... (the launcher made one per persistent disk of the VM).
func ReplicatedDisks(ctx context.Context, q *qmp.Conn) ([]int64, error) {
	devices, err := blockDevices(ctx, q)
	if err != nil {
		return nil, err
	}
	var sizes []int64
	for {
		size, ok := devices[DiskNode(len(sizes))]
		if !ok {
			break
		}
		sizes = append(sizes, size)
	}
	if len(sizes) == 0 {
		return nil, fmt.Errorf("the member's QEMU has no replicated disk (no %s among its block devices): its launcher did not make it a COLO member", DiskNode(0))
	}
	return sizes, nil
}

// blockDevices are the QEMU's block devices (query-block), each with the virtual size of its
// medium (0 without one).
func blockDevices(ctx context.Context, q *qmp.Conn) (map[string]int64, error) {
	var blocks []struct {
		Device   string `json:"device"`
		Inserted *struct {
			Image struct {
				VirtualSize int64 `json:"virtual-size"`
			} `json:"image"`
		} `json:"inserted"`
	}
	if err := q.Execute(ctx, "query-block", nil, &blocks); err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(blocks))
	for _, b := range blocks {
		out[b.Device] = 0
		if b.Inserted != nil {
			out[b.Device] = b.Inserted.Image.VirtualSize
		}
	}
	return out, nil
}

// Tuning is how the primary's QEMU checkpoints.
type Tuning struct {
	// Checkpoint is the longest time between two checkpoints (x-checkpoint-delay).
	Checkpoint time.Duration
	// CompareTimeout is how long colo-compare holds a packet of the primary that the secondary
	// has not matched before it forces a checkpoint (QEMU's default: 3 s). A short one bounds the
	// latency that a slow or diverging secondary adds to the VM's replies, at the cost of more
	// checkpoints.
	CompareTimeout time.Duration
	// CrossedWait, when set, forces a checkpoint sooner than CompareTimeout where both guests'
	// data has waited this long, the primary's on one TCP connection and the secondary's on
	// another: guests that took their clients' requests in a different order and each hold what
	// the other gave away (a database's row locks), whose replies wait for counterparts that only
	// a checkpoint brings (lockstep's x-crossed-timeout, hack/qemu/colo-compare-waits-crossed.patch).
	CrossedWait time.Duration
	// RAMAhead sends the pages the VM dirtied since the last checkpoint while the VM still runs,
	// just before each checkpoint (lockstep's x-colo-ram-ahead), so that the checkpoint's pause
	// sends only those it dirtied meanwhile. Both QEMUs need hack/qemu/colo-send-ram-ahead.patch.
	RAMAhead bool
}

// Job is one entry of query-block-jobs.
type Job struct {
	ID    string `json:"device"`
	Ready bool   `json:"ready"`
	Len   int64  `json:"len"`
	Done  int64  `json:"offset"`
}

// Jobs is query-block-jobs.
func Jobs(ctx context.Context, q *qmp.Conn) ([]Job, error) {
	var jobs []Job
	err := q.Execute(ctx, "query-block-jobs", nil, &jobs)
	return jobs, err
}

// Every packet filter and colo-compare of a pair, on both sides, runs with vnet_hdr_support: the
// chardevs between them then carry each packet's virtio-net header length beside it, so that
// colo-compare and filter-rewriter find the IP header behind the header that a virtio NIC on a
// tap with IFF_VNET_HDR (libvirt's, QEMU's default) puts before every frame. Without it nothing
// parses: the primary's packets leave uncompared, and the rewriter rewrites nothing. A NIC
// without a header (rtl8139, e1000) sends a length of 0, so the setting is right for every NIC;
// both ends of each chardev must agree, or its framing is lost without an error.

// StartPrimary makes a primary whose disks were resynced (and whose VM is stopped, so that nothing
// changes between the resync and the migration) replicate its disk writes, divert its packets
// through colo-compare, and migrate into COLO, checkpointing as t says (at least every
// t.Checkpoint; colo-compare forces one sooner when the two sides' packets differ, or when a
// packet of the primary found no match within t.CompareTimeout, or data of both sides waited
// crossed for t.CrossedWait, which it looks for every half of the shorter). afterRewriter is set
// on a primary that was a secondary: its filters must come before the filter-rewriter it kept.
func StartPrimary(ctx context.Context, q *qmp.Conn, s Sockets, t Tuning, afterRewriter bool, disks int) error {
	netdev, err := Netdev(ctx, q)
	if err != nil {
		return err
	}
	var steps []step
	for i := range disks {
		if _, err := q.HMP(ctx, ReplicationDriveAdd(s, i)); err != nil {
			return err
		}
		steps = append(steps, step{"x-blockdev-change", map[string]any{"parent": DiskNode(i), "node": ReplicationNode(i)}})
	}
	filter := func(typ, id string, kv ...string) step {
		args := map[string]any{"qom-type": typ, "id": id, "netdev": netdev, "vnet_hdr_support": true}
		for i := 0; i+1 < len(kv); i += 2 {
			args[kv[i]] = kv[i+1]
		}
		if afterRewriter {
			args["insert"], args["position"] = "before", "id=rew0"
		}
		return step{"object-add", args}
	}
	shortest := t.CompareTimeout
	compare := map[string]any{"qom-type": "colo-compare", "id": compareID, "primary_in": "compare0-0", "secondary_in": "compare1", "outdev": "compare_out0", "iothread": "iothread1", "vnet_hdr_support": true,
		"compare_timeout": max(t.CompareTimeout.Milliseconds(), 1)}
	if t.CrossedWait > 0 {
		compare[propCrossedTimeout] = max(t.CrossedWait.Milliseconds(), 1)
		shortest = min(shortest, t.CrossedWait)
	}
	compare["expired_scan_cycle"] = max(shortest.Milliseconds()/2, 1)
	return run(ctx, q, "primary COLO start", false, append(steps, []step{
		filter("filter-mirror", "m0", "queue", "tx", "outdev", "mirror0"),
		filter("filter-redirector", "redire0", "queue", "rx", "indev", "compare_out"),
		filter("filter-redirector", "redire1", "queue", "rx", "outdev", "compare0"),
		{"object-add", map[string]any{"qom-type": "iothread", "id": "iothread1"}},
		{"object-add", compare},
		colo(t.RAMAhead),
		{"migrate-set-parameters", map[string]any{"x-checkpoint-delay": t.Checkpoint.Milliseconds()}},
		{"migrate", map[string]any{"uri": "unix:" + s.Path(StreamMigration)}},
	}...))
}

// ReplicationNode is the primary's replication child of its i-th disk, which writes to the
// secondary's replica over NBD.
func ReplicationNode(i int) string { return "replication" + strconv.Itoa(i) }

// ReplicationDriveAdd is the HMP command that makes the primary's replication child of its i-th
// disk: the NBD client of the secondary's parent<i> export over the NBD stream's socket, which
// StartPrimary then makes the second child of the quorum DiskNode(i). lockstep's QEMU completes
// a write there once it is copied and sends the copy behind it (docs/colo.md, patches 13 and 14).
func ReplicationDriveAdd(s Sockets, i int) string {
	return "drive_add -n buddy driver=replication,mode=primary,file.driver=nbd,file.server.type=unix,file.server.path=" +
		s.Path(StreamNBD) + ",file.export=" + parentNode(i) + ",node-name=" + ReplicationNode(i)
}

// PrimaryCapabilities checks that the primary's QEMU takes the migration capabilities t needs,
// and sets them; StartPrimary sets them again. Called before a protection changes anything, so
// that a QEMU that refuses one (one without lockstep's patch for RAMAhead) costs no disk resync
// and gets an error that says what to do. It returns t as this QEMU can take it: without
// CrossedWait where its colo-compare has no crossed wait (a launcher that still runs a
// lockstep-qemu image from before hack/qemu/colo-compare-waits-crossed.patch, which it keeps
// until its VM runs again: such a VM is protected as before, its lock waits ending on the
// compare timeout).
func PrimaryCapabilities(ctx context.Context, q *qmp.Conn, t Tuning) (Tuning, error) {
	err := run(ctx, q, "primary capabilities", false, []step{colo(t.RAMAhead)})
	if err != nil && t.RAMAhead && strings.Contains(err.Error(), "x-colo-ram-ahead") {
		return t, fmt.Errorf("%w: this QEMU cannot send RAM ahead of a checkpoint (lockstep's hack/qemu/colo-send-ram-ahead.patch); run lockstepd with --colo-ram-ahead=false", err)
	}
	if err != nil || t.CrossedWait <= 0 {
		return t, err
	}
	known, err := crossedWaitKnown(ctx, q)
	if !known {
		t.CrossedWait = 0
	}
	return t, err
}

// crossedWaitKnown says whether colo-compare takes x-crossed-timeout, from QEMU's QAPI schema: its
// object-add refuses a member it does not know. (qom-list-properties would tell from the object's
// own properties, but it makes a colo-compare to list them, and QEMU 10.2 aborts when it finalizes
// one that was never completed.)
func crossedWaitKnown(ctx context.Context, q *qmp.Conn) (bool, error) {
	var schema []struct {
		Members []struct {
			Name string `json:"name"`
		} `json:"members"`
	}
	if err := q.Execute(ctx, "query-qmp-schema", nil, &schema); err != nil {
		return false, err
	}
	for _, typ := range schema {
		for _, m := range typ.Members {
			if m.Name == propCrossedTimeout {
				return true, nil
			}
		}
	}
	return false, nil
}

// Netdev is the id of the backend of the VM's one NIC, which the packet filters attach to: each
// launcher names it its own way (libvirt: "host" + the NIC's alias). It is found through QOM: the
// NIC is the one device with a netdev property.
func Netdev(ctx context.Context, q *qmp.Conn) (string, error) {
	var devs []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	if err := q.Execute(ctx, "qom-list", map[string]any{"path": "/machine/peripheral"}, &devs); err != nil {
		return "", err
	}
	var found []string
	for _, d := range devs {
		if !strings.HasPrefix(d.Type, "child<") {
			continue
		}
		var netdev string
		if q.Execute(ctx, "qom-get", map[string]any{"path": "/machine/peripheral/" + d.Name, "property": "netdev"}, &netdev) == nil && netdev != "" {
			found = append(found, netdev)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("COLO compares the packets of one NIC with an id; the VM has %d (%v)", len(found), found)
	}
	return found[0], nil
}

// Connected reports whether the chardevs ids have a peer connected.
func Connected(ctx context.Context, q *qmp.Conn, ids ...string) (bool, error) {
	var devs []struct {
		Label    string `json:"label"`
		Filename string `json:"filename"`
	}
	if err := q.Execute(ctx, "query-chardev", nil, &devs); err != nil {
		return false, err
	}
	up := map[string]bool{}
	for _, d := range devs {
		up[d.Label] = !strings.HasPrefix(d.Filename, "disconnected:")
	}
	for _, id := range ids {
		if !up[id] {
			return false, nil
		}
	}
	return true, nil
}

// Status is query-colo-status.
type Status struct {
	Mode     string `json:"mode"`
	LastMode string `json:"last-mode"`
	Reason   string `json:"reason"`
}

// modePrimary is query-colo-status's mode of a COLO primary.
const modePrimary = "primary"

// WaitMode waits until the side is in COLO mode want ("primary" or "secondary").
func WaitMode(ctx context.Context, q *qmp.Conn, want string) error {
	for {
		var st Status
		if err := q.Execute(ctx, "query-colo-status", nil, &st); err != nil {
			return err
		}
		if st.Mode == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("COLO mode %q, want %q: %w", st.Mode, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// step is one QMP command of a sequence.
type step struct {
	cmd  string
	args any
}

// run executes a sequence in order; a step whose object is already gone counts as done when
// tolerateGone is set (a side may have torn part of it down itself).
func run(ctx context.Context, q *qmp.Conn, what string, tolerateGone bool, steps []step) error {
	for _, s := range steps {
		err := q.Execute(ctx, s.cmd, s.args, nil)
		gone := err != nil && isGone(err)
		if err != nil && (!tolerateGone || !gone) {
			return fmt.Errorf("%s, %s: %w", what, s.cmd, err)
		}
	}
	return nil
}

// isGone reports whether QEMU refused a teardown step because its object is already gone.
func isGone(err error) bool {
	for _, s := range []string{"not found", "does not have", "is not enabled", "Cannot find", "No active block job",
		"NBD server not running", "VM is not in COLO mode"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

// SecondaryGoLive makes the secondary the VM after its primary was lost: stop taking the
// primary's disk writes, leave COLO (QEMU merges the active and hidden disks and resumes the
// guest), and stop listening for the primary's packet streams. Its network must then be
// attached by the caller.
func SecondaryGoLive(ctx context.Context, q *qmp.Conn) error {
	return run(ctx, q, "secondary go-live", false, secondaryGoLive)
}

// FinishSecondaryGoLive is SecondaryGoLive after an earlier lockstepd began it and died: the
// steps it already took count as done (QEMU refuses them as "not running", "not in COLO mode",
// "not found").
func FinishSecondaryGoLive(ctx context.Context, q *qmp.Conn) error {
	return run(ctx, q, "secondary go-live, finished", true, secondaryGoLive)
}

var secondaryGoLive = []step{
	{"nbd-server-stop", nil},
	{"x-colo-lost-heartbeat", nil},
	{"object-del", map[string]any{"id": "f2"}},
	{"object-del", map[string]any{"id": "f1"}},
	{"chardev-remove", map[string]any{"id": "red1"}},
	{"chardev-remove", map[string]any{"id": "red0"}},
}

// PrimaryGoAlone lets the primary run on without its lost secondary: drop each disk's replication
// child (disks of them), stop comparing and mirroring packets, and leave COLO (QEMU's documented
// order). Steps whose object is already gone count as done, so that it can be repeated.
func PrimaryGoAlone(ctx context.Context, q *qmp.Conn, disks int) error {
	var steps []step
	for i := range disks {
		steps = append(steps, step{"x-blockdev-change", map[string]any{"parent": DiskNode(i), "child": "children.1"}},
			step{"human-monitor-command", map[string]any{"command-line": "drive_del " + ReplicationNode(i)}})
	}
	return run(ctx, q, "primary go-alone", true, append(steps, []step{
		{"object-del", map[string]any{"id": compareID}},
		{"object-del", map[string]any{"id": "iothread1"}},
		{"object-del", map[string]any{"id": "m0"}},
		{"object-del", map[string]any{"id": "redire0"}},
		{"object-del", map[string]any{"id": "redire1"}},
		{"x-colo-lost-heartbeat", nil},
	}...))
}
