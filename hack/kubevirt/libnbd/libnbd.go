// Package libnbd stands in for libnbd's Go binding in lockstep's build of KubeVirt
// (hack/build-kubevirt.sh): the Go module proxy does not serve libguestfs.org/libnbd, and only
// virt-launcher's NBD client (changed-block backups) calls it. It has the names that client uses,
// and every call fails, so a backup through a launcher built here fails with this error instead of
// reading a disk; nothing lockstep runs calls it.
package libnbd

import "errors"

// ErrUnavailable is what every call returns.
var ErrUnavailable = errors.New("libnbd is not in lockstep's build of KubeVirt (hack/kubevirt/libnbd)")

// The NBD protocol's metadata contexts and extent flags (the NBD specification's values).
const (
	CONTEXT_BASE_ALLOCATION   = "base:allocation"
	CONTEXT_QEMU_DIRTY_BITMAP = "qemu:dirty-bitmap:"

	STATE_HOLE  = uint32(1)
	STATE_ZERO  = uint32(2)
	STATE_DIRTY = uint32(1)
)

// LibnbdExtent is one extent of a block status reply.
type LibnbdExtent struct {
	Length uint64
	Flags  uint64
}

// Extent64Callback receives a block status reply's extents.
type Extent64Callback func(metacontext string, offset uint64, entries []LibnbdExtent, err *int) int

// BlockStatus64Optargs and PreadOptargs are the calls' optional arguments.
type (
	BlockStatus64Optargs struct{}
	PreadOptargs         struct{}
)

// Libnbd is a handle; Create never makes one.
type Libnbd struct{}

// Create fails: there is no libnbd here.
func Create() (*Libnbd, error) { return nil, ErrUnavailable }

func (*Libnbd) Close() error                              { return nil }
func (*Libnbd) AddMetaContext(string) error               { return ErrUnavailable }
func (*Libnbd) CanMetaContext(string) (bool, error)       { return false, ErrUnavailable }
func (*Libnbd) SetExportName(string) error                { return ErrUnavailable }
func (*Libnbd) ConnectUnix(string) error                  { return ErrUnavailable }
func (*Libnbd) GetSize() (uint64, error)                  { return 0, ErrUnavailable }
func (*Libnbd) Pread([]byte, uint64, *PreadOptargs) error { return ErrUnavailable }
func (*Libnbd) BlockStatus64(uint64, uint64, Extent64Callback, *BlockStatus64Optargs) error {
	return ErrUnavailable
}
