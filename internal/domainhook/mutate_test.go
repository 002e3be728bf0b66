package domainhook_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/domainhook"
	"github.com/lockstep-dev/lockstep/test/virtlauncher"
)

// The reference domains: a member VMI's domain as KubeVirt v1.9 generates it (testdata, with how
// each was written).
var references = []string{"q35-seabios.xml", "q35-ovmf.xml"}

// The reference VMI's replicated disks (both filesystem claims) and their overlays.
var replicated = []struct {
	name, active, hidden string
	bytes                int64 // the primary's disk's, at which a secondary opens its replica
}{{"rootdisk", "colo-active", "colo-hidden", 3044 << 20}, {"datadisk", "colo-active-1", "colo-hidden-1", 2 << 30}}

func claimImage(name string) string {
	return "/var/run/kubevirt-private/vmi-disks/" + name + "/disk.img"
}
func emptyImage(name string) string { return "/var/run/libvirt/empty-disks/" + name + ".qcow2" }

func member(secondary bool) domainhook.Member {
	m := domainhook.Member{Secondary: secondary, Sockets: colo.Sockets{Dir: "/var/run/lockstep/0c4e2f1a-7b3d-4e5f-9a1b-2c3d4e5f6a7b"}}
	for _, r := range replicated {
		m.Disks = append(m.Disks, domainhook.ReplicatedDisk{
			Disk:   domainhook.Disk{Alias: "ua-" + r.name, Image: claimImage(r.name), Format: "raw"},
			Active: domainhook.Disk{Alias: "ua-" + r.active, Image: emptyImage(r.active), Format: "qcow2"},
			Hidden: domainhook.Disk{Alias: "ua-" + r.hidden, Image: emptyImage(r.hidden), Format: "qcow2"}})
		if secondary {
			m.Disks[len(m.Disks)-1].Bytes = r.bytes
		}
	}
	return m
}

func reference(t *testing.T, name string) *libvirtxml.Domain {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "kubevirt-v1.9", name))
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, raw)
}

func parse(t *testing.T, raw []byte) *libvirtxml.Domain {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(raw)); err != nil {
		t.Fatalf("the domain does not parse: %v\n%s", err, raw)
	}
	return &d
}

func marshal(t *testing.T, d *libvirtxml.Domain) []byte {
	t.Helper()
	s, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s)
}

func mutate(t *testing.T, d *libvirtxml.Domain, m domainhook.Member) *libvirtxml.Domain {
	t.Helper()
	out, err := domainhook.Mutate(marshal(t, d), m)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, out)
}

func args(d *libvirtxml.Domain) []string {
	var a []string
	if d.QEMUCommandline != nil {
		for _, x := range d.QEMUCommandline.Args {
			a = append(a, x.Value)
		}
	}
	return a
}

func disk(d *libvirtxml.Domain, alias string) *libvirtxml.DomainDisk {
	for i := range d.Devices.Disks {
		if d.Devices.Disks[i].Alias != nil && d.Devices.Disks[i].Alias.Name == alias {
			return &d.Devices.Disks[i]
		}
	}
	return nil
}

// containsRun says whether want appears in got, in order and adjacent.
func containsRun(got, want []string) bool {
	for i := 0; i+len(want) <= len(got); i++ {
		if slices.Equal(got[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// TestTheDefineSequenceGivesOneMemberDomain: KubeVirt calls the hook on q35 first with placeholder
// NICs, then on libvirt's read-back of that output (its devices, with KubeVirt's NICs put back, and
// KubeVirt's original elsewhere: no <qemu:commandline>, no <qemu:override>); a third call (more
// root ports, for a guest over 2 GiB) gets the second's output with them. Every call must give the same member domain, on both
// roles and both firmwares. Before, the second call failed ("disk ua-rootdisk is not backed by a
// file") and the NIC lookup counted the placeholders.
func TestTheDefineSequenceGivesOneMemberDomain(t *testing.T) {
	for _, ref := range references {
		for _, secondary := range []bool{false, true} {
			role := map[bool]string{false: "primary", true: "secondary"}[secondary]
			t.Run(strings.TrimSuffix(ref, ".xml")+"/"+role, func(t *testing.T) {
				m := member(secondary)
				d := reference(t, ref)
				n := virtlauncher.Placeholders(d)
				if n != 3 {
					t.Fatalf("KubeVirt adds %d placeholder NICs to a q35 domain with one NIC, want 3", n)
				}
				first := mutate(t, virtlauncher.WithPlaceholders(d, n), m)
				if got := len(first.Devices.Interfaces); got != 1+n {
					t.Fatalf("the first call's output has %d NICs, want the VM's and %d placeholders", got, n)
				}
				second := mutate(t, virtlauncher.Readback(d, first), m)
				checkMember(t, second, m)
				// The third call (a guest over 2 GiB): the second's output with KubeVirt's root ports.
				withPorts := virtlauncher.WithRootPorts(second, 3)
				third := mutate(t, withPorts, m)
				if !slices.Equal(marshal(t, third), marshal(t, withPorts)) {
					t.Errorf("the hook changed its own output with root ports added:\n%s\n---\n%s", marshal(t, withPorts), marshal(t, third))
				}
				// Without placeholders (one call), the same domain as the sequence's.
				once := mutate(t, d, m)
				if !slices.Equal(marshal(t, once), marshal(t, second)) {
					t.Errorf("one call and the define sequence give different domains:\n%s\n---\n%s", marshal(t, once), marshal(t, second))
				}
			})
		}
	}
}

// checkMember checks a member's domain: lockstepd's monitor and the role's COLO arguments once
// each, each replicated disk's device on a read-only placeholder pointed at its quorum, the
// overlays out of the guest's devices, the other disks as they were, and the NIC in userspace
// with one queue.
func checkMember(t *testing.T, d *libvirtxml.Domain, m domainhook.Member) {
	t.Helper()
	a := args(d)
	s := m.Sockets
	want := [][]string{colo.MonitorArgs(s)}
	if m.Secondary {
		want = append(want, colo.SecondaryNetArgs(s, "hostua-vmnet"), colo.IncomingArgs(s))
	}
	for i, r := range replicated {
		if m.Secondary {
			want = append(want, colo.SecondaryDiskArgs(i, colo.Image{Path: claimImage(r.name), Format: "raw", Bytes: r.bytes}, emptyImage(r.active), emptyImage(r.hidden)))
		} else {
			want = append(want, colo.PrimaryDiskArgs(i, colo.Image{Path: claimImage(r.name), Format: "raw"}))
		}
	}
	for _, w := range want {
		if !containsRun(a, w) {
			t.Errorf("arguments %v lack %v", a, w)
		}
	}
	if n := strings.Count(strings.Join(a, " "), colo.MonitorArgs(s)[1]); n != 1 {
		t.Errorf("lockstepd's monitor is given %d times: %v", n, a)
	}
	if !m.Secondary && slices.ContainsFunc(a, func(x string) bool { return x == "-incoming" || strings.Contains(x, "filter-") }) {
		t.Errorf("a primary got a secondary's arguments: %v", a)
	}
	if d.QEMUOverride == nil || len(d.QEMUOverride.Devices) != len(replicated) {
		t.Fatal("not one override of each replicated disk's device")
	}
	for i, r := range replicated {
		dev := disk(d, "ua-"+r.name)
		if dev == nil || dev.Source.Block == nil || dev.Source.Block.Dev != "/dev/null" || dev.ReadOnly == nil || dev.Target.Dev != "vd"+string(rune('a'+i)) {
			t.Fatalf("the replicated disk %s's device: %+v", r.name, dev)
		}
		o := d.QEMUOverride.Devices[i]
		if o.Alias != "ua-"+r.name || len(o.Frontend.Properties) != 1 || o.Frontend.Properties[0] != (libvirtxml.DomainQEMUOverrideProperty{Name: "drive", Type: "string", Value: colo.DiskNode(i)}) {
			t.Fatalf("the override of %s: %+v", r.name, o)
		}
		if disk(d, "ua-"+r.active) != nil || disk(d, "ua-"+r.hidden) != nil {
			t.Errorf("the overlays of %s are guest disks", r.name)
		}
	}
	if ci := disk(d, "ua-cloudinit"); ci == nil || ci.Source.File == nil || ci.Source.File.File != "/var/run/libvirt/cloud-init-dir/demo/counter-1/noCloud.iso" || len(d.Devices.Disks) != 3 {
		t.Errorf("the other disks changed: %d disks, cloudinit %+v", len(d.Devices.Disks), ci)
	}
	if len(d.Devices.Interfaces) != 1 {
		t.Fatalf("%d NICs, want the VM's one", len(d.Devices.Interfaces))
	}
	nic := d.Devices.Interfaces[0]
	if nic.Driver == nil || nic.Driver.Name != "qemu" || nic.Driver.Queues > 1 {
		t.Errorf("the NIC's driver %+v: want vhost off (name qemu) and one queue", nic.Driver)
	}
}

func TestMutate(t *testing.T) {
	in := reference(t, "q35-seabios.xml")
	t.Run("emulator", func(t *testing.T) {
		m := member(false)
		m.Emulator = "/usr/local/lockstep/bin/qemu-system-x86_64"
		if d := mutate(t, in, m); d.Devices.Emulator != m.Emulator {
			t.Fatalf("emulator %q", d.Devices.Emulator)
		}
	})

	t.Run("the guest's devices are the same on both members", func(t *testing.T) {
		// Both VMIs carry the overlays; neither guest sees them.
		p, s := mutate(t, in, member(false)), mutate(t, in, member(true))
		px, sx := marshal(t, &libvirtxml.Domain{Devices: p.Devices}), marshal(t, &libvirtxml.Domain{Devices: s.Devices})
		if !slices.Equal(px, sx) {
			t.Errorf("the members' devices differ:\n%s\n---\n%s", px, sx)
		}
	})

	t.Run("vhost and multiqueue", func(t *testing.T) {
		vhost := reference(t, "q35-seabios.xml")
		vhost.Devices.Interfaces[0].Driver = &libvirtxml.DomainInterfaceDriver{Name: "vhost"}
		if nic := mutate(t, vhost, member(true)).Devices.Interfaces[0]; nic.Driver.Name != "qemu" {
			t.Errorf("vhost stayed on: %+v", nic.Driver)
		}
		vhost.Devices.Interfaces[0].Driver.Queues = 2
		if _, err := domainhook.Mutate(marshal(t, vhost), member(false)); err == nil || !strings.Contains(err.Error(), "2 queues") {
			t.Errorf("a NIC with 2 queues: %v", err)
		}
	})

	bad := []struct {
		name string
		edit func(string) string
		m    func(*domainhook.Member)
		want string
	}{
		{"no such disk", nil, func(m *domainhook.Member) { m.Disks[0].Disk.Alias = "ua-data" },
			`no disk "ua-data" (it has ua-rootdisk, ua-datadisk, ua-cloudinit, ua-colo-active, ua-colo-hidden, ua-colo-active-1, ua-colo-hidden-1)`},
		{"no disk to replicate", nil, func(m *domainhook.Member) { m.Disks = nil }, "at least one disk"},
		{"a disk elsewhere than KubeVirt puts it", func(x string) string {
			return strings.Replace(x, "vmi-disks/rootdisk/disk.img", "elsewhere/disk.img", 1)
		}, nil, "the hook expects the raw image " + claimImage("rootdisk")},
		{"a second disk elsewhere", func(x string) string {
			return strings.Replace(x, "vmi-disks/datadisk/disk.img", "elsewhere/disk.img", 1)
		}, nil, "the hook expects the raw image " + claimImage("datadisk")},
		{"a secondary without its overlays", nil, func(m *domainhook.Member) { *m = member(true); m.Disks[1].Active = domainhook.Disk{} }, "overlays of disk ua-datadisk"},
		{"raw overlays", func(x string) string {
			return strings.Replace(x, `type="qcow2"`, `type="raw"`, 1)
		}, func(m *domainhook.Member) { m.Disks[0].Active.Format = "raw" }, "COLO's overlays must be qcow2"},
		{"two NICs", func(x string) string {
			return strings.Replace(x, "<interface", `<interface type="ethernet"><alias name="ua-second"></alias></interface><interface`, 1)
		}, nil, "one NIC; the domain has 2"},
		{"a block volume", func(x string) string {
			return strings.Replace(x, `<source file="`+claimImage("datadisk")+`"></source>`, `<source dev="/dev/datadisk"></source>`, 1)
		}, nil, "not backed by a file"},
		{"a SATA disk", func(x string) string { return strings.Replace(x, `dev="vda" bus="virtio"`, `dev="sda" bus="sata"`, 1) }, nil, "only a virtio disk"},
		{"a directory too deep for socket paths", nil, func(m *domainhook.Member) { m.Sockets = colo.Sockets{Dir: "/" + strings.Repeat("d", 100)} }, "107"},
		{"not XML", func(string) string { return "<domain" }, nil, "does not parse"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			x := string(marshal(t, in))
			if tt.edit != nil {
				x = tt.edit(x)
			}
			m := member(false)
			if tt.m != nil {
				tt.m(&m)
			}
			_, err := domainhook.Mutate([]byte(x), m)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestDiskSizes: a secondary opens each replica at its primary's disk's size (QEMU's raw "size"
// option: the claim's image is larger), or whole without one; a primary opens its disk at
// the size it is given (one started from copies), or whole; only a raw image takes a size.
func TestDiskSizes(t *testing.T) {
	d := reference(t, references[0])
	a := strings.Join(args(mutate(t, d, member(true))), " ")
	for _, want := range []string{
		"id=parent0,driver=raw,file.filename=" + claimImage("rootdisk") + ",size=3191865344,",
		"id=parent1,driver=raw,file.filename=" + claimImage("datadisk") + ",size=2147483648,",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("the secondary's arguments lack %q:\n%s", want, a)
		}
	}
	p := member(false)
	if a := strings.Join(args(mutate(t, d, p)), " "); strings.Contains(a, "size=") {
		t.Errorf("a primary with no sizes opened its disk at one: %s", a)
	}
	p.Disks[1].Bytes = 2 << 30
	if a := strings.Join(args(mutate(t, d, p)), " "); !strings.Contains(a, "children.0.file.filename="+claimImage("datadisk")+",children.0.size=2147483648") {
		t.Errorf("a primary started from copies does not open its disk at the disk's size: %s", a)
	}

	raw, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	s := member(true)
	s.Disks[0].Bytes = 0 // a secondary an operator made before the sizes: its replica whole, as then
	out, err := domainhook.Mutate([]byte(raw), s)
	if err != nil || strings.Contains(string(out), "file.filename="+claimImage("rootdisk")+",size=") {
		t.Errorf("a secondary without disk sizes: %v", err)
	}
	if err := (colo.Image{Path: "/disk.qcow2", Format: "qcow2", Bytes: 2 << 30}).Validate(); err == nil || !strings.Contains(err.Error(), "raw images only") {
		t.Errorf("a qcow2 image at a set size: %v", err)
	}
}
