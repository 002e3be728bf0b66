package domainhook_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/domainhook"
)

func member(secondary bool) domainhook.Member {
	return domainhook.Member{Secondary: secondary, Sockets: colo.Sockets{Dir: "/var/run/lockstep/0c4e2f1a"},
		Disk: "ua-rootdisk", Active: "ua-colo-active", Hidden: "ua-colo-hidden"}
}

func mutate(t *testing.T, in []byte, m domainhook.Member) (*libvirtxml.Domain, error) {
	t.Helper()
	out, err := domainhook.Mutate(in, m)
	if err != nil {
		return nil, err
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(out)); err != nil {
		t.Fatalf("the mutated domain does not parse: %v\n%s", err, out)
	}
	return &d, nil
}

func args(d *libvirtxml.Domain) []string {
	var a []string
	for _, x := range d.QEMUCommandline.Args {
		a = append(a, x.Value)
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

func TestMutate(t *testing.T) {
	in, err := os.ReadFile("testdata/member.xml")
	if err != nil {
		t.Fatal(err)
	}
	s := member(false).Sockets
	rootImage := "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"

	t.Run("primary", func(t *testing.T) {
		d, err := mutate(t, in, member(false))
		if err != nil {
			t.Fatal(err)
		}
		a := args(d)
		if a[0] != "-no-user-config" {
			t.Errorf("the domain's own arguments were not kept first: %v", a)
		}
		for _, want := range [][]string{colo.MonitorArgs(s), colo.PrimaryDiskArgs(rootImage, "raw")} {
			if !containsRun(a, want) {
				t.Errorf("arguments %v lack %v", a, want)
			}
		}
		for _, not := range []string{"-incoming", "filter-redirector"} {
			if strings.Contains(strings.Join(a, " "), not) {
				t.Errorf("a primary got %s: %v", not, a)
			}
		}
		if disk(d, "ua-colo-active") != nil || disk(d, "ua-colo-hidden") != nil || len(d.Devices.Disks) != 2 {
			t.Errorf("a primary's overlays are guest disks, or other disks changed: %d disks", len(d.Devices.Disks))
		}
		checkTakenOver(t, d)
	})

	t.Run("secondary", func(t *testing.T) {
		d, err := mutate(t, in, member(true))
		if err != nil {
			t.Fatal(err)
		}
		a := args(d)
		active := "/var/run/kubevirt-ephemeral-disks/disk-data/colo-active/disk.qcow2"
		hidden := "/var/run/kubevirt-ephemeral-disks/disk-data/colo-hidden/disk.qcow2"
		for _, want := range [][]string{colo.MonitorArgs(s), colo.SecondaryNetArgs(s, "hostua-default"),
			colo.SecondaryDiskArgs(rootImage, "raw", active, hidden), colo.IncomingArgs(s)} {
			if !containsRun(a, want) {
				t.Errorf("arguments %v lack %v", a, want)
			}
		}
		if disk(d, "ua-colo-active") != nil || disk(d, "ua-colo-hidden") != nil {
			t.Error("the overlays are still guest disks")
		}
		if disk(d, "ua-cloudinitdisk") == nil || len(d.Devices.Disks) != 2 {
			t.Errorf("the other disks changed: %d disks", len(d.Devices.Disks))
		}
		checkTakenOver(t, d)
	})

	t.Run("emulator", func(t *testing.T) {
		m := member(false)
		m.Emulator = "/usr/local/lockstep/bin/qemu-system-x86_64"
		d, err := mutate(t, in, m)
		if err != nil || d.Devices.Emulator != m.Emulator {
			t.Fatalf("emulator %q (%v)", d.Devices.Emulator, err)
		}
	})

	t.Run("the guest's devices are the same on both members", func(t *testing.T) {
		// Both VMIs carry the overlays; neither guest sees them.
		p, _ := mutate(t, in, member(false))
		s, _ := mutate(t, in, member(true))
		px, _ := (&libvirtxml.Domain{Devices: p.Devices}).Marshal()
		sx, _ := (&libvirtxml.Domain{Devices: s.Devices}).Marshal()
		if px != sx {
			t.Errorf("the members' devices differ:\n%s\n---\n%s", px, sx)
		}
	})

	bad := []struct {
		name string
		edit func(string) string
		m    domainhook.Member
		want string
	}{
		{"no such disk", nil, domainhook.Member{Sockets: s, Disk: "ua-data"}, `no disk "ua-data" (it has ua-rootdisk, ua-colo-active, ua-colo-hidden, ua-cloudinitdisk)`},
		{"a cdrom", nil, domainhook.Member{Sockets: s, Disk: "ua-cloudinitdisk"}, "is a cdrom, not a disk"},
		{"a secondary without its overlays", func(x string) string { return strings.ReplaceAll(x, "ua-colo-", "ua-other-") }, member(true), `no disk "ua-colo-active"`},
		{"raw overlays", func(x string) string { return strings.Replace(x, `type="qcow2"`, `type="raw"`, 1) }, member(true), "COLO's overlays must be qcow2"},
		{"two NICs", func(x string) string {
			return strings.Replace(x, "<interface", `<interface type="ethernet"><alias name="ua-second"></alias></interface><interface`, 1)
		}, member(true), "one NIC; the domain has 2"},
		{"a block volume", func(x string) string {
			return strings.Replace(x, `<source file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"></source>`, `<source dev="/dev/rootdisk"></source>`, 1)
		}, member(false), "not backed by a file"},
		{"a SATA disk", func(x string) string { return strings.Replace(x, `bus="virtio" dev="vda"`, `bus="sata" dev="sdb"`, 1) }, member(false), "only a virtio disk"},
		{"a directory too deep for socket paths", nil, domainhook.Member{Sockets: colo.Sockets{Dir: "/" + strings.Repeat("d", 100)}, Disk: "ua-rootdisk"}, "107"},
		{"not XML", func(string) string { return "<domain" }, member(false), "does not parse"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			x := string(in)
			if tt.edit != nil {
				x = tt.edit(x)
			}
			_, err := domainhook.Mutate([]byte(x), tt.m)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// checkTakenOver: the replicated disk's device stays libvirt's, on a read-only placeholder, and
// is pointed at the quorum.
func checkTakenOver(t *testing.T, d *libvirtxml.Domain) {
	t.Helper()
	root := disk(d, "ua-rootdisk")
	if root == nil || root.Source.Block == nil || root.Source.Block.Dev != "/dev/null" || root.ReadOnly == nil || root.Target.Dev != "vda" {
		t.Fatalf("the replicated disk's device: %+v", root)
	}
	if d.QEMUOverride == nil || len(d.QEMUOverride.Devices) != 1 {
		t.Fatal("no override of the disk's device")
	}
	o := d.QEMUOverride.Devices[0]
	if o.Alias != "ua-rootdisk" || len(o.Frontend.Properties) != 1 || o.Frontend.Properties[0] != (libvirtxml.DomainQEMUOverrideProperty{Name: "drive", Type: "string", Value: colo.DiskID}) {
		t.Fatalf("the override: %+v", o)
	}
}
