package v1alpha1

// Labels and annotations that the operator puts on the member VMIs (and their claims). They are
// the contract between the operator, lockstepd and anyone selecting members with kubectl.
const (
	// ReservedPrefix begins every label and annotation key of lockstep's own; a template may not
	// set one (each is a fact with one writer, lockstep).
	ReservedPrefix = "ft.lockstep.dev/"
	// LabelPair names the FaultTolerantVM that a member belongs to.
	LabelPair = "ft.lockstep.dev/pair"
	// LabelRole is "primary" or "secondary".
	LabelRole = "ft.lockstep.dev/role"
	// LabelNode is the node that placement chose for the member (on a copy of a disk: for the
	// member that uses it).
	LabelNode = "ft.lockstep.dev/node"
	// LabelMember, on a claim the operator created, names the member VMI that uses it.
	LabelMember = "ft.lockstep.dev/member"
	// LabelEvacuation, on an operation the operator made because a drain asked to evict a
	// member (KubeVirt's status.evacuationNodeName), names the node being drained.
	LabelEvacuation = "ft.lockstep.dev/evacuation"
	// LabelManagedBy marks objects the operator created.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value.
	ManagedByValue = "lockstep"
	// LabelComponent says which part of lockstep an object belongs to; ComponentLockstepd marks
	// lockstepd's pods and node leases.
	LabelComponent     = "app.kubernetes.io/component"
	ComponentLockstepd = "lockstepd"

	// AnnotationOrdinal counts the members of a pair: the first primary is 1.
	AnnotationOrdinal = "ft.lockstep.dev/ordinal"
	// AnnotationRoleSince is when the member took its role (RFC 3339).
	AnnotationRoleSince = "ft.lockstep.dev/role-since"
	// AnnotationSyncedAt, on a secondary, is when it was first known to hold the primary's state
	// (RFC 3339): only such a secondary may be promoted, and only while lockstepd does not report
	// it unsynchronized. lockstepd sets it when its engine's initial synchronization completes; on
	// a node without lockstepd (no logging address), the operator sets it once the secondary has
	// run beside a primary on a healthy node.
	AnnotationSyncedAt = "ft.lockstep.dev/synced-at"
	// AnnotationTemplate holds the template the member was built from (JSON), so that a new
	// secondary is built from exactly what the surviving primary runs.
	AnnotationTemplate = "ft.lockstep.dev/template"
	// AnnotationTemplateHash is a hash of AnnotationTemplate.
	AnnotationTemplateHash = "ft.lockstep.dev/template-hash"
	// AnnotationReservedLogBandwidth is the logging bandwidth (Mbit/s) placement reserved for the
	// member on its node.
	AnnotationReservedLogBandwidth = "ft.lockstep.dev/reserved-log-bandwidth-mbps"
	// AnnotationEpoch, on a member, is the epoch of the pair's record at which it became the
	// primary.
	AnnotationEpoch = "ft.lockstep.dev/epoch"
	// AnnotationFollows, on a secondary, names the primary it was started beside: only that
	// primary's state can be in it (on a secondary's copy of a disk: only that primary's disk).
	AnnotationFollows = "ft.lockstep.dev/follows"
	// AnnotationFencedReason and AnnotationFencedMessage, on a member labelled fenced, say why.
	AnnotationFencedReason  = "ft.lockstep.dev/fenced-reason"
	AnnotationFencedMessage = "ft.lockstep.dev/fenced-message"
	// AnnotationSourceClaim, on a claim the operator created for a member's copy of a disk, names
	// the user's claim it copies.
	AnnotationSourceClaim = "ft.lockstep.dev/source-claim"
	// AnnotationReplicaOf says whose replicas of the primary's disks a COLO secondary's copies
	// hold, so that a later secondary of the same primary can take them over and be sent only
	// what the VM wrote since (an incremental resync). On a copy, it names the secondary that
	// lockstepd marked synchronized with it; on a new secondary VMI that took over copies, it
	// names that earlier secondary, and the primary's lockstepd passes it to its engine, which
	// copies only the difference when its record of what the VM wrote counts from that
	// secondary, and the whole disks otherwise.
	AnnotationReplicaOf = "ft.lockstep.dev/replica-of"
	// AnnotationSupersededBy, on a claim the template names, is set once a failover made a copy
	// of it the VM's disk: it names that copy, the claim that holds the VM's current disk (this
	// one holds an older state).
	AnnotationSupersededBy = "ft.lockstep.dev/superseded-by"
	// LabelRetainedFrom, on a claim the operator made that held the VM's current disk when its
	// FaultTolerantVM was deleted (diskRetention Retain), names that FaultTolerantVM; the claim
	// has no owner then, and AnnotationRetainedFromUID is the FaultTolerantVM's UID.
	LabelRetainedFrom         = "ft.lockstep.dev/retained-from"
	AnnotationRetainedFromUID = "ft.lockstep.dev/retained-from-uid"

	// AnnotationReplicatedDisk, on a member VMI, names the disks that COLO replicates, in order,
	// comma-separated (default: every disk on a claim that is not a CD-ROM).
	AnnotationReplicatedDisk = "ft.lockstep.dev/replicated-disk"
	// AnnotationDiskBytes, on a member VMI, is the size in bytes of each disk COLO replicates
	// ("<volume>=<bytes>,..."): the member opens each one's image at exactly that size and its
	// overlays have it, since QEMU pairs only images of one size. The operator sets it on every
	// secondary, from its primary's sizes, and on a primary that starts from copies the operator
	// made; a primary started from the template's claims has none (its disks are what they are).
	// On a claim the operator made, it is the size of the VM's disk that the claim holds ("<bytes>").
	AnnotationDiskBytes = "ft.lockstep.dev/disk-bytes"
	// AnnotationMeasuredDiskBytes, on a member VMI that runs the VM, is the size in bytes of each
	// replicated disk as its QEMU opened it ("<volume>=<bytes>,..."); lockstepd sets it once it
	// attached to the member's QEMU. The operator sizes the next secondary from it.
	AnnotationMeasuredDiskBytes = "ft.lockstep.dev/measured-disk-bytes"

	// AnnotationNodeLoggingAddress, on a Node, is where its lockstepd listens for FT log
	// connections ("ip:port" on the logging network); lockstepd sets it when it starts.
	AnnotationNodeLoggingAddress = "ft.lockstep.dev/logging-address"

	// AnnotationNodeStreamAddress, on a Node, is where its lockstepd relays an engine's own
	// streams (QEMU COLO's: checkpoints, disk writes, packets), on the logging network too.
	AnnotationNodeStreamAddress = "ft.lockstep.dev/stream-address"

	// AnnotationNodeMaxVMs, on a Node, overrides the cluster's FT VM limit for that node.
	AnnotationNodeMaxVMs = "ft.lockstep.dev/max-ft-vms"
	// AnnotationNodeMaxVCPUs, on a Node, overrides the cluster's FT vCPU limit for that node.
	AnnotationNodeMaxVCPUs = "ft.lockstep.dev/max-ft-vcpus"
	// AnnotationNodeLogBandwidth, on a Node, overrides the logging bandwidth budget (Mbit/s).
	AnnotationNodeLogBandwidth = "ft.lockstep.dev/log-bandwidth-mbps"

	// Finalizer keeps a FaultTolerantVM until its members are gone.
	Finalizer = "ft.lockstep.dev/members"
)

// DiskColoActive and DiskColoHidden are the names of a member's COLO overlays of its first
// replicated disk (those of the others end in -<index>): emptyDisk volumes of the disk's size,
// which the KubeVirt hook takes out of the guest's devices and a secondary's replication chain
// writes to until a failover merges them.
const (
	DiskColoActive = "colo-active"
	DiskColoHidden = "colo-hidden"
)

// Roles of a member, the values of LabelRole.
const (
	RolePrimary   = "primary"
	RoleSecondary = "secondary"
	// RoleFenced: the member does not hold the pair's record and must never run the VM again;
	// lockstepd stops it and the operator deletes it.
	RoleFenced = "fenced"
)
