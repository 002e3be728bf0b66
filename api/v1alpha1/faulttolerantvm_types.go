package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
)

// RunStrategy says whether the protected VM should run.
// +kubebuilder:validation:Enum=Running;Halted
type RunStrategy string

const (
	// RunStrategyRunning keeps a primary and a secondary running.
	RunStrategyRunning RunStrategy = "Running"
	// RunStrategyHalted stops both members.
	RunStrategyHalted RunStrategy = "Halted"
)

// UpdatePolicy says what becomes of a template change while the VM runs.
// +kubebuilder:validation:Enum=Staged;Refuse
type UpdatePolicy string

const (
	// UpdatePolicyStaged accepts template changes at any time and applies them when the VM is
	// halted and run again (KubeVirt's Stage rollout); RestartRequired says one is pending.
	UpdatePolicyStaged UpdatePolicy = "Staged"
	// UpdatePolicyRefuse refuses template changes at admission while runStrategy is Running:
	// halt the VM, change it, run it again. For fleets where drift must be an error.
	UpdatePolicyRefuse UpdatePolicy = "Refuse"
)

// DiskRetention says what deleting a FaultTolerantVM does with the claims that hold the VM's
// current disks.
// +kubebuilder:validation:Enum=Retain;Delete
type DiskRetention string

const (
	// DiskRetentionRetain keeps them. After a failover they are the claims the operator made
	// for the member that went live, not the template's: deleting the FaultTolerantVM releases
	// them (no owner), labels them ft.lockstep.dev/retained-from=<name> and names them in a
	// DisksRetained event.
	DiskRetentionRetain DiskRetention = "Retain"
	// DiskRetentionDelete deletes them with everything else the operator made.
	DiskRetentionDelete DiskRetention = "Delete"
)

// OnDelete says what deleting a FaultTolerantVM does with its VM.
// +kubebuilder:validation:Enum=Stop;Release
type OnDelete string

const (
	// OnDeleteStop stops the VM with its members; diskRetention says what becomes of its disks.
	OnDeleteStop OnDelete = "Stop"
	// OnDeleteRelease hands the VM back to KubeVirt: once both members are gone, a plain
	// VirtualMachine of the FaultTolerantVM's name runs it, on its current disks (those a failover
	// moved it to included), with its firmware UUID and MAC addresses, and with runStrategy
	// Always (Halted when the FaultTolerantVM's is). The VM restarts once: a cold boot.
	OnDeleteRelease OnDelete = "Release"
)

// AdoptFrom names the KubeVirt VirtualMachine that a FaultTolerantVM takes over.
type AdoptFrom struct {
	// virtualMachineName is a VirtualMachine in the FaultTolerantVM's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	VirtualMachineName string `json:"virtualMachineName,omitempty"`
}

// Protection says whether the pair keeps a secondary: vSphere FT's Turn On, Suspend and Turn Off.
// +kubebuilder:validation:Enum=Enabled;Suspended;Disabled
type Protection string

const (
	// ProtectionEnabled keeps a synchronized secondary beside the primary.
	ProtectionEnabled Protection = "Enabled"
	// ProtectionSuspended stops the secondary; the primary runs on, unprotected. The secondary's
	// node stays reserved for the pair (its FT limit, vCPUs and logging bandwidth), so that
	// setting Enabled again always finds room there.
	ProtectionSuspended Protection = "Suspended"
	// ProtectionDisabled stops the secondary and releases its reservation; the primary runs on,
	// unprotected, and keeps its own reservation and the pair's record and history.
	ProtectionDisabled Protection = "Disabled"
)

// FTState is the fault tolerance state of a FaultTolerantVM, as vSphere's FT summary shows it.
// +kubebuilder:validation:Enum=Starting;Protected;NotProtected;FailingOver;Stopped
type FTState string

const (
	// StateStarting: the primary, or the first secondary, is not running yet.
	StateStarting FTState = "Starting"
	// StateProtected: a primary and a secondary run on two different nodes.
	StateProtected FTState = "Protected"
	// StateNotProtected: the primary runs without a running secondary, or the VM cannot start
	// (no eligible node, invalid spec, missing logging network or disk); the Protected condition
	// says why.
	StateNotProtected FTState = "NotProtected"
	// StateFailingOver: the primary was lost and its secondary is being promoted.
	StateFailingOver FTState = "FailingOver"
	// StateStopped: runStrategy is Halted and no member runs.
	StateStopped FTState = "Stopped"
)

// Condition types of a FaultTolerantVM.
const (
	// ConditionValid is False when the spec cannot be protected; nothing new is started then.
	ConditionValid = "Valid"
	// ConditionPrimaryReady is True while the primary VMI runs on a healthy node.
	ConditionPrimaryReady = "PrimaryReady"
	// ConditionSecondaryReady is True while the secondary VMI runs on a healthy node.
	ConditionSecondaryReady = "SecondaryReady"
	// ConditionProtected is True while both members run on different healthy nodes.
	ConditionProtected = "Protected"
	// ConditionMemberFenced is True while a member that may no longer run the VM is being
	// stopped: a lost primary whose secondary took over, or a member labelled primary that does
	// not hold the pair's record (two primaries; the record decides).
	ConditionMemberFenced = "MemberFenced"
	// ConditionRestartRequired is True when the template changed after the members were created:
	// members keep the template they were built from until the VM is halted and run again.
	ConditionRestartRequired = "RestartRequired"
)

// Condition reasons. Each names what happened, so that a person knows what to do.
const (
	ReasonRunning        = "Running"
	ReasonStarting       = "Starting"
	ReasonScheduling     = "Scheduling"
	ReasonProtected      = "Protected"
	ReasonHalted         = "Halted"
	ReasonNoEligibleNode = "NoEligibleNode"
	ReasonNodeLost       = "NodeLost"
	// ReasonNodeSilentReplicating: the member's node stopped reporting to the API server (its
	// kubelet or its link to the API server failed), but lockstepd on it still reports the
	// member replicating, so the VM runs on there: check the node's kubelet and network; lockstep
	// fails over on lockstepd's word, or when its reports stop for the node-lost grace.
	ReasonNodeSilentReplicating  = "NodeSilentReplicating"
	ReasonMemberFailed           = "MemberFailed"
	ReasonPromoted               = "SecondaryPromoted"
	ReasonPrimaryLost            = "PrimaryLost"
	ReasonSecondaryLost          = "SecondaryLost"
	ReasonSecondaryStarting      = "SecondaryStarting"
	ReasonInvalidSpec            = "InvalidSpec"
	ReasonValid                  = "SpecValid"
	ReasonLoggingNetworkNotFound = "LoggingNetworkNotFound"
	ReasonTemplateChanged        = "TemplateChanged"
	ReasonTemplateCurrent        = "TemplateCurrent"
	ReasonDiskNotFound           = "DiskNotFound"
	// ReasonDuplicatePrimary: a member labelled primary did not hold the pair's record.
	ReasonDuplicatePrimary = "DuplicatePrimary"
	// ReasonNoneFenced: no member is being fenced.
	ReasonNoneFenced = "NoneFenced"
	// ReasonMemberFenced is the event of a member being fenced.
	ReasonMemberFenced = "MemberFenced"
	// ReasonMemberCreated is the event of members placed and created: a new pair's two in one
	// event, or a new secondary.
	ReasonMemberCreated = "MemberCreated"
	// ReasonDisksRetained is the event of a deleted FaultTolerantVM's current disks kept
	// (diskRetention Retain): it names the claims that hold them.
	ReasonDisksRetained = "DisksRetained"
	// ReasonWaitingForSecondary: the primary is lost and its synchronized secondary is on a node
	// that is not Ready; promoting it later loses nothing, restarting now would lose the memory.
	ReasonWaitingForSecondary = "WaitingForSecondary"
	// ReasonWaitingForRecordTerm: the member that holds the pair's record cannot be seen (its
	// node is not Ready or gone) but renewed the record less than a term ago: it may still run,
	// and pauses itself once it cannot renew. The VM starts elsewhere only once the term passed.
	ReasonWaitingForRecordTerm = "WaitingForRecordTerm"
	// ReasonWitnessedBySecondary: the primary cannot be seen (its node is cut from the API server,
	// or not Ready), but its synchronized secondary renews the pair's record for it, which it does
	// only while it hears the primary: the pair runs protected. Nothing moves while it does; see
	// the node's connection to the control plane.
	ReasonWitnessedBySecondary = "WitnessedBySecondary"
	// ReasonProtectionSuspended and ReasonProtectionDisabled: spec.protection stopped the secondary.
	ReasonProtectionSuspended = "ProtectionSuspended"
	ReasonProtectionDisabled  = "ProtectionDisabled"
	// ReasonWaitingForDiskSizes: under COLO a secondary's images must be exactly as large as the
	// primary's disks, which lockstepd on the primary's node reports once the VM runs there; the
	// secondary is created then. It lasts seconds, unless lockstepd there does not run or cannot
	// reach the primary's QEMU, or the sizes miss a disk (the message says which).
	ReasonWaitingForDiskSizes = "WaitingForDiskSizes"
	// ReasonWaitingForCopies: under COLO, the secondary that was just dropped left copies of the
	// disks that hold its replicas of the primary's; the next secondary waits for its VMI to go
	// (a minute at most, and not for a lost node) so that it can take them over on their node
	// and be sent only what the VM wrote since, not the whole disks.
	ReasonWaitingForCopies = "WaitingForCopies"
	// ReasonDiskSizeUnsupported: a disk of the VM is a size that COLO's secondary cannot be given
	// (KubeVirt makes the secondary's overlays in whole MiB): resize the disk to a multiple of 1 MiB.
	ReasonDiskSizeUnsupported = "DiskSizeUnsupported"
	// ReasonAdopting: spec.adoptFrom names a VirtualMachine that still exists or still runs; the
	// pair starts once the operator stopped and removed it (its disks stay). The message says
	// what it waits for: a VirtualMachineInstance stuck on a lost node waits for the node.
	ReasonAdopting = "Adopting"
	// ReasonAdopted is the event of an adopted VirtualMachine removed, its disks kept for the pair.
	ReasonAdopted = "Adopted"
	// ReasonAdoptionIdentityChanged is a warning event: the template's firmware UUID or a MAC
	// address differs from what the adopted VirtualMachine's guest saw, so the guest will see
	// new hardware (kubectl ftvm adopt writes a template that keeps them).
	ReasonAdoptionIdentityChanged = "AdoptionIdentityChanged"
	// ReasonVirtualMachineReturned is a warning event: the VirtualMachine that spec.adoptFrom names
	// was created again after it was adopted (a GitOps tool that still has it, say); the operator
	// stops and removes it again. Remove it from wherever it comes from.
	ReasonVirtualMachineReturned = "VirtualMachineReturned"
	// ReasonReleased is the event of a deleted FaultTolerantVM handed back to KubeVirt
	// (onDelete Release): it names the VirtualMachine and its claims.
	ReasonReleased = "Released"
	// ReasonReleaseBlocked is a warning event: onDelete is Release, but a VirtualMachine of the
	// FaultTolerantVM's name exists that the operator did not make. Deletion waits: remove or
	// rename that VirtualMachine, or set onDelete to Stop.
	ReasonReleaseBlocked = "ReleaseBlocked"
	// ReasonEvacuating is the event of a drain asking to evict a member (KubeVirt marked its VMI
	// for evacuation): it names the operation that moves the member off the node.
	ReasonEvacuating = "Evacuating"
	// ReasonEvacuationWaiting is the event of a drain that waits on a member: no other node can
	// take the VM's next secondary, so moving the member would leave the VM unprotected. Add room,
	// or raise FT limits.
	ReasonEvacuationWaiting = "EvacuationWaiting"
	// ReasonLauncherReleased is the event of the operator deleting at once the launcher pod of a
	// member whose node is lost: KubeVirt finishes a deleted VMI only once its pod is gone, and no
	// kubelet ends a pod on a lost node. It does so only once the pair's record shows that nothing
	// of the member runs the VM (another member holds the record, or its term has passed).
	ReasonLauncherReleased = "LauncherReleased"
)

// LoggingNetwork names the dedicated Multus network that carries FT logging traffic.
type LoggingNetwork struct {
	// name of a NetworkAttachmentDefinition, in the FaultTolerantVM's namespace or as
	// "namespace/name".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name,omitempty"`

	// config is a CNI configuration (JSON). When set, the operator creates the
	// NetworkAttachmentDefinition with this config if it does not exist; an existing one is
	// never changed.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Config string `json:"config,omitempty"`
}

// ExpectedLoad is what the guest does on average, from which the operator sizes the logging
// bandwidth that placement reserves for the VM (docs/performance.md, "Sizing the logging link").
// With COLO members (the default install) the secondary gets the memory the guest dirties, what
// it writes to its disks and what it receives, and sends back what it transmits; it reads its own
// disks: bandwidth ~= ((memoryDirty + diskWrite) MB/s * 8 + networkReceive + networkTransmit
// Mbit/s) * 1.2, and no less than the operator's default per-VM bandwidth where memoryDirtyMBps
// is not given. Without COLO, the white paper's formula (section 2.10): bandwidth ~= (diskRead
// MB/s * 8 + networkReceive Mbit/s) * 1.2.
type ExpectedLoad struct {
	// diskReadMBps is the average disk read throughput of the guest in MB/s. COLO sends none of
	// it (each member reads its own disks): only members without COLO are sized by it.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	DiskReadMBps int32 `json:"diskReadMBps,omitempty"`
	// diskWriteMBps is the average disk write throughput of the guest in MB/s (COLO).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	DiskWriteMBps int32 `json:"diskWriteMBps,omitempty"`
	// memoryDirtyMBps is the rate at which the guest dirties its memory in MB/s, as
	// `virsh domdirtyrate-calc` measures it on the VM unprotected (COLO).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	MemoryDirtyMBps int32 `json:"memoryDirtyMBps,omitempty"`
	// networkReceiveMbps is the average network receive rate of the guest in Mbit/s.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	NetworkReceiveMbps int32 `json:"networkReceiveMbps,omitempty"`
	// networkTransmitMbps is the average network transmit rate of the guest in Mbit/s (COLO:
	// the secondary's copy of it comes back to the primary to be compared).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	NetworkTransmitMbps int32 `json:"networkTransmitMbps,omitempty"`
}

// VMITemplateMeta is the metadata given to both members.
type VMITemplateMeta struct {
	// labels of both members' VMIs (KubeVirt copies them to the launcher pods).
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// annotations of both members' VMIs.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// VMITemplate is the VM that is made fault tolerant: a KubeVirt VirtualMachineInstance spec.
// +kubebuilder:validation:XValidation:rule="(has(self.spec.domain.memory) && has(self.spec.domain.memory.guest)) || (has(self.spec.domain.resources) && has(self.spec.domain.resources.requests) && 'memory' in self.spec.domain.resources.requests)",message="the guest memory must be set (spec.domain.memory.guest or spec.domain.resources.requests.memory): FT reserves it in full on both nodes"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.domain.devices.gpus) || size(self.spec.domain.devices.gpus) == 0",message="GPUs cannot be fault tolerant: a passthrough device's state cannot be replicated to the secondary"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.domain.devices.hostDevices) || size(self.spec.domain.devices.hostDevices) == 0",message="host devices cannot be fault tolerant: a passthrough device's state cannot be replicated to the secondary"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.volumes) || self.spec.volumes.all(v, !has(v.hostDisk))",message="hostDisk volumes cannot be fault tolerant: they live on one node; use a persistentVolumeClaim"
type VMITemplate struct {
	// metadata is given to both members.
	// +optional
	Metadata VMITemplateMeta `json:"metadata,omitempty"`
	// spec is the KubeVirt VirtualMachineInstanceSpec of both members.
	// +required
	Spec virtv1.VirtualMachineInstanceSpec `json:"spec"`
}

// FaultTolerantVMSpec is the desired state of a FaultTolerantVM.
// +kubebuilder:validation:XValidation:rule="has(self.adoptFrom) == has(oldSelf.adoptFrom) && (!has(self.adoptFrom) || self.adoptFrom == oldSelf.adoptFrom)",message="adoptFrom cannot be set, changed or removed after the FaultTolerantVM is created"
// +kubebuilder:validation:XValidation:rule="!has(self.onDelete) || self.onDelete != 'Release' || !has(self.diskRetention) || self.diskRetention != 'Delete'",message="onDelete Release gives the VM's current disks to the VirtualMachine it releases: diskRetention must be Retain"
type FaultTolerantVMSpec struct {
	// runStrategy is Running, which keeps a protected pair running; Halted stops both members.
	// +default="Running"
	// +optional
	RunStrategy RunStrategy `json:"runStrategy,omitempty"`

	// updatePolicy is Staged (template changes wait for the VM's next halt and run) or Refuse
	// (template changes are refused while the VM runs).
	// +default="Staged"
	// +optional
	UpdatePolicy UpdatePolicy `json:"updatePolicy,omitempty"`

	// protection is Enabled (a primary and a synchronized secondary), Suspended (the secondary
	// stopped, its node kept reserved) or Disabled (the secondary stopped, nothing reserved).
	// While it is not Enabled the VM runs unprotected, and the Protected condition says why.
	// +default="Enabled"
	// +optional
	Protection Protection `json:"protection,omitempty"`

	// diskRetention is what deleting this FaultTolerantVM does with the claims that hold the
	// VM's current disks: Retain keeps them, Delete deletes them. After a failover those are
	// claims the operator made (each named <member>-<volume>), and the template's claims hold an
	// older state of the disks; the template's claims are never deleted either way.
	// +default="Retain"
	// +optional
	DiskRetention DiskRetention `json:"diskRetention,omitempty"`

	// onDelete is what deleting this FaultTolerantVM does with its VM: Stop (the default) stops
	// it; Release hands it back to KubeVirt as a plain VirtualMachine of this name, on its current
	// disks, keeping its firmware UUID and MAC addresses (its current disks are then always kept,
	// so diskRetention must be Retain).
	// +default="Stop"
	// +optional
	OnDelete OnDelete `json:"onDelete,omitempty"`

	// adoptFrom names an existing KubeVirt VirtualMachine, in this namespace, that this
	// FaultTolerantVM takes over: the operator stops it, removes it (its DataVolumes and claims
	// stay, no longer owned by it) and only then starts the pair on the same disks, so that the
	// VM never runs twice. The template should be that VirtualMachine's with its firmware UUID
	// and MAC addresses made explicit: kubectl ftvm adopt writes it so. It cannot be changed.
	// +optional
	AdoptFrom *AdoptFrom `json:"adoptFrom,omitempty"`

	// loggingNetwork is the dedicated network for FT logging traffic.
	// +required
	LoggingNetwork LoggingNetwork `json:"loggingNetwork"`

	// topologyKey is a node label (for example topology.kubernetes.io/zone) whose domains the two
	// members are also kept apart in, when set. They are always on different nodes.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	TopologyKey string `json:"topologyKey,omitempty"`

	// expectedLoad sizes the logging bandwidth that placement reserves for this VM on both nodes.
	// Without it the operator's default per-VM bandwidth is reserved.
	// +optional
	ExpectedLoad *ExpectedLoad `json:"expectedLoad,omitempty"`

	// template is the VM. Changes take effect when the VM is halted and run again
	// (see the RestartRequired condition): both members of a pair must run the same VM.
	// +required
	Template VMITemplate `json:"template"`
}

// MemberStatus describes one member of the pair.
type MemberStatus struct {
	// vmi is the name of the member's VirtualMachineInstance.
	// +kubebuilder:validation:MinLength=1
	// +required
	VMI string `json:"vmi,omitempty"`
	// uid is the member VMI's UID: a member's name may be used again once it is gone.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=36
	// +optional
	UID string `json:"uid,omitempty"`
	// node is the node the member was placed on.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Node string `json:"node,omitempty"`
	// phase is the VMI's phase.
	// +optional
	Phase virtv1.VirtualMachineInstancePhase `json:"phase,omitempty"`
	// since is when the member took this role.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// ReplicationStatus is what the lockstepd of each side reports; each writes only its own side.
type ReplicationStatus struct {
	// primary is reported by the lockstepd of the member that runs the VM.
	// +optional
	Primary *SideStatus `json:"primary,omitempty"`
	// secondary is reported by the lockstepd of the member that follows it.
	// +optional
	Secondary *SideStatus `json:"secondary,omitempty"`
}

// SideState is a side's state in lockstepd.
// +kubebuilder:validation:Enum=Protected;Replicating;Claiming;Alone;Fenced;Lapsed
type SideState string

// The states of a side; lockstepd reports its internal/failover state by the same names.
const (
	SideProtected   SideState = "Protected"
	SideReplicating SideState = "Replicating"
	SideClaiming    SideState = "Claiming"
	SideAlone       SideState = "Alone"
	SideFenced      SideState = "Fenced"
	SideLapsed      SideState = "Lapsed"
)

// SideStatus is one side of the pair as its lockstepd sees it.
type SideStatus struct {
	// vmi is the member VMI.
	// +kubebuilder:validation:MinLength=1
	// +required
	VMI string `json:"vmi,omitempty"`
	// node is where it runs.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Node string `json:"node,omitempty"`
	// state is Protected (the primary's outputs leave on acknowledgement), Replicating (a
	// secondary applying the log), Claiming (the peer went silent; the pair's Lease is being
	// claimed), Alone (runs the VM without a secondary), Fenced (lost the Lease or could not reach
	// it: stopped for good), Lapsed (could not renew the pair's record within its term: the VM is
	// paused and releases nothing until a renewal goes through).
	// +required
	State SideState `json:"state,omitempty"`
	// since is when the side entered State.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
	// epoch is the pair's Lease epoch the side knows.
	// +optional
	Epoch int64 `json:"epoch,omitempty"`
	// synchronized says that a secondary holds the primary's state.
	// +optional
	Synchronized bool `json:"synchronized,omitempty"`
	// connected says that the FT log connection is up.
	// +optional
	Connected bool `json:"connected,omitempty"`
	// lastHeartbeatTime is when the peer was last heard.
	// +optional
	LastHeartbeatTime *metav1.Time `json:"lastHeartbeatTime,omitempty"`
	// heldOutputs is the number of outputs waiting for an acknowledgement.
	// +optional
	HeldOutputs int32 `json:"heldOutputs,omitempty"`
	// message says why a side is Fenced, or what went wrong.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Message string `json:"message,omitempty"`
	// reportTime is when lockstepd wrote this report.
	// +required
	ReportTime metav1.Time `json:"reportTime"`
}

// FaultTolerantVMStatus is the observed state of a FaultTolerantVM.
type FaultTolerantVMStatus struct {
	// conditions are Valid, PrimaryReady, SecondaryReady, Protected, MemberFenced, RestartRequired.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// state is the FT state.
	// +optional
	State FTState `json:"state,omitempty"`

	// primary is the member that runs the VM.
	// +optional
	Primary *MemberStatus `json:"primary,omitempty"`

	// secondary is the member that follows the primary and takes over when it is lost.
	// +optional
	Secondary *MemberStatus `json:"secondary,omitempty"`

	// vLockstepInterval is how far the secondary trails the primary, as lockstepd measures it.
	// +optional
	VLockstepInterval *metav1.Duration `json:"vLockstepInterval,omitempty"`

	// logBandwidth is the FT logging traffic in bytes per second, as the primary's lockstepd
	// measures it over its last status interval (at least). It is absent for a while after the
	// primary's state changes, until a whole interval of the new state is measured.
	// +optional
	LogBandwidth *resource.Quantity `json:"logBandwidth,omitempty"`

	// checkpoints is what the COLO engine's checkpoints cost the VM, as the primary's lockstepd
	// measures them (absent for an engine without checkpoints).
	// +optional
	Checkpoints *CheckpointStatus `json:"checkpoints,omitempty"`

	// resync is the copy of the primary's disks into a new secondary while it runs, as the
	// primary's lockstepd reports it; absent otherwise.
	// +optional
	Resync *ResyncStatus `json:"resync,omitempty"`

	// lastResync is the last copy of the primary's disks into a secondary that completed, as the
	// primary's lockstepd reports it; absent before the primary's first.
	// +optional
	LastResync *LastResyncStatus `json:"lastResync,omitempty"`

	// reservedLogBandwidthMbps is the logging bandwidth that placement reserved for this VM on
	// each member's node, in Mbit/s.
	// +optional
	ReservedLogBandwidthMbps int32 `json:"reservedLogBandwidthMbps,omitempty"`

	// replication is what lockstepd reports of each side of the pair.
	// +optional
	Replication *ReplicationStatus `json:"replication,omitempty"`

	// epoch is the epoch of the pair's record (the Lease that names the member allowed to run
	// the VM); it grows with every change of that member.
	// +optional
	Epoch int64 `json:"epoch,omitempty"`

	// failoverCount counts the promotions of a secondary, as the pair's record counts them.
	// +optional
	FailoverCount int32 `json:"failoverCount,omitempty"`

	// lastFailoverTime is when the last secondary was promoted.
	// +optional
	LastFailoverTime *metav1.Time `json:"lastFailoverTime,omitempty"`
}

// ResyncStatus is the progress of the copy of a primary's disks into a new secondary, which
// must catch up before the secondary can hold the VM's state.
type ResyncStatus struct {
	// startTime is when the copy began.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// doneBytes is what is copied, of all the replicated disks together.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DoneBytes *int64 `json:"doneBytes,omitempty"`

	// totalBytes is what there is to copy: QEMU's estimate, which grows when the guest writes
	// where the copy has passed.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TotalBytes *int64 `json:"totalBytes,omitempty"`

	// bytesPerSecond is the copy's mean rate since it began.
	// +optional
	BytesPerSecond *resource.Quantity `json:"bytesPerSecond,omitempty"`

	// estimatedCompletionTime is when the copy will have caught up at that rate.
	// +optional
	EstimatedCompletionTime *metav1.Time `json:"estimatedCompletionTime,omitempty"`
}

// LastResyncStatus is a completed copy of the primary's disks into a secondary.
type LastResyncStatus struct {
	// secondary is the member the disks were copied into.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Secondary string `json:"secondary,omitempty"`

	// incremental says that only what the VM wrote since was copied: the secondary took over the
	// copies of an earlier secondary of the same primary (annotation ft.lockstep.dev/replica-of),
	// whose replicas they held. Otherwise the whole disks were copied.
	// +optional
	Incremental *bool `json:"incremental,omitempty"`

	// copiedBytes is what was copied, of all the replicated disks together.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CopiedBytes *int64 `json:"copiedBytes,omitempty"`

	// durationMilliseconds is how long the copy took, the VM's last stop for it included.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DurationMilliseconds *int64 `json:"durationMilliseconds,omitempty"`

	// completionTime is when it completed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// CheckpointStatus is what the COLO engine's checkpoints cost the VM. A checkpoint is due every
// checkpoint period; colo-compare forces one sooner when the secondary's packets differ from the
// primary's or come later than the compare timeout. A VM whose checkpoints are mostly forced
// has its replies held until a checkpoint instead of released on a match: they are slow.
type CheckpointStatus struct {
	// pauseMilliseconds is how long the primary's VM stands still for a checkpoint (a moving
	// average), in milliseconds.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PauseMilliseconds *int32 `json:"pauseMilliseconds,omitempty"`

	// perSecond is how many checkpoints a second the pair took over lockstepd's last status
	// interval (absent, like logBandwidth, until one is measured).
	// +optional
	PerSecond *resource.Quantity `json:"perSecond,omitempty"`

	// forcedPerSecond is how many of them a second colo-compare forced before the periodic one
	// was due: mismatchPerSecond, timeoutPerSecond, unparsedPerSecond and crossedPerSecond
	// together, or, with a QEMU that does not count them, a guess from the time between
	// checkpoints.
	// +optional
	ForcedPerSecond *resource.Quantity `json:"forcedPerSecond,omitempty"`

	// mismatchPerSecond is how many checkpoints a second colo-compare forced because the two
	// sides' packets differed: the guest's output is not deterministic (absent when the VM's
	// QEMU does not count causes).
	// +optional
	MismatchPerSecond *resource.Quantity `json:"mismatchPerSecond,omitempty"`

	// timeoutPerSecond is how many checkpoints a second colo-compare forced because a packet of
	// one side waited longer than the compare timeout for the other's: the secondary runs behind
	// (absent when the VM's QEMU does not count causes).
	// +optional
	TimeoutPerSecond *resource.Quantity `json:"timeoutPerSecond,omitempty"`

	// unparsedPerSecond is how many checkpoints a second colo-compare forced because it held a
	// packet of the primary that it cannot compare (IPv6, ARP, anything but IPv4): such a packet
	// leaves only at the next checkpoint, so a VM that talks mostly IPv6 waits for checkpoints
	// (absent when the VM's QEMU does not count causes).
	// +optional
	UnparsedPerSecond *resource.Quantity `json:"unparsedPerSecond,omitempty"`

	// crossedPerSecond is how many checkpoints a second colo-compare forced because data of each
	// side waited for the other's on different connections, longer than lockstepd's
	// --colo-crossed-wait: the two guests served their clients in a different order and each
	// holds what the other gave away, as a database's row locks granted differently (absent when
	// the VM's QEMU does not count causes).
	// +optional
	CrossedPerSecond *resource.Quantity `json:"crossedPerSecond,omitempty"`
}

// FaultTolerantVM runs a KubeVirt VM as a primary and a secondary on two nodes, so that the VM
// survives the loss of either node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ftvm;ftvms,categories=all;lockstep
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Primary",type=string,JSONPath=`.status.primary.node`
// +kubebuilder:printcolumn:name="Secondary",type=string,JSONPath=`.status.secondary.node`
// +kubebuilder:printcolumn:name="Interval",type=string,JSONPath=`.status.vLockstepInterval`
// +kubebuilder:printcolumn:name="Bandwidth",type=string,JSONPath=`.status.logBandwidth`
// +kubebuilder:printcolumn:name="Failovers",type=integer,JSONPath=`.status.failoverCount`,priority=1
// +kubebuilder:printcolumn:name="Epoch",type=integer,JSONPath=`.status.epoch`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FaultTolerantVM struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the object's metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the VM to protect, and how.
	// +required
	Spec FaultTolerantVMSpec `json:"spec,omitempty"`
	// status is what the operator and lockstepd observe.
	// +optional
	Status FaultTolerantVMStatus `json:"status,omitempty"`
}

// FaultTolerantVMList is a list of FaultTolerantVMs.
//
// +kubebuilder:object:root=true
type FaultTolerantVMList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FaultTolerantVM `json:"items"`
}
