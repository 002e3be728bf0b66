package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OperationType is a one-time operation on a FaultTolerantVM's pair, as vSphere FT offers them.
// +kubebuilder:validation:Enum=TestFailover;TestRestartSecondary;MigrateSecondary
type OperationType string

const (
	// OperationTestFailover makes the synchronized secondary the primary while the primary still
	// runs, as a lost primary would: the old primary is fenced and a new secondary started.
	OperationTestFailover OperationType = "TestFailover"
	// OperationTestRestartSecondary stops the secondary and starts a new one, as a lost secondary
	// would; the primary runs on.
	OperationTestRestartSecondary OperationType = "TestRestartSecondary"
	// OperationMigrateSecondary moves the secondary to another node (spec.node, or any node that
	// fits): the secondary is stopped and a new one started and synchronized there. The VM is
	// unprotected until it is.
	OperationMigrateSecondary OperationType = "MigrateSecondary"
)

// OperationPhase is where an operation is.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type OperationPhase string

const (
	// OperationPending: waiting for the pair to be Protected, or for an earlier operation.
	OperationPending OperationPhase = "Pending"
	// OperationRunning: the operation started; status says on which members.
	OperationRunning OperationPhase = "Running"
	// OperationSucceeded: done, and the pair is Protected again.
	OperationSucceeded OperationPhase = "Succeeded"
	// OperationFailed: the operation did not do what it asks; the message says why, and whether
	// it changed anything.
	OperationFailed OperationPhase = "Failed"
)

// FaultTolerantVMOperationSpec is the operation to run.
// +kubebuilder:validation:XValidation:rule="self.type == 'MigrateSecondary' || !has(self.node)",message="node is only for MigrateSecondary"
type FaultTolerantVMOperationSpec struct {
	// faultTolerantVMName is the FaultTolerantVM, in the operation's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	FaultTolerantVMName string `json:"faultTolerantVMName,omitempty"`

	// type is TestFailover, TestRestartSecondary or MigrateSecondary.
	// +required
	Type OperationType `json:"type,omitempty"`

	// node is where MigrateSecondary starts the new secondary; without it placement chooses
	// any node that fits other than the secondary's and the primary's.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Node string `json:"node,omitempty"`
}

// FaultTolerantVMOperationStatus is what became of the operation. The operator writes what it
// will act on before it acts, so that an operator restarted midway carries on, and never does
// the operation twice.
type FaultTolerantVMOperationStatus struct {
	// phase is Pending, Running, Succeeded or Failed.
	// +optional
	Phase OperationPhase `json:"phase,omitempty"`

	// message says what the operation waits for, did, or why it failed.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`

	// primary is the pair's primary when the operation started.
	// +optional
	Primary *MemberStatus `json:"primary,omitempty"`
	// secondary is the pair's secondary when the operation started.
	// +optional
	Secondary *MemberStatus `json:"secondary,omitempty"`

	// result are the pair's members when the operation succeeded.
	// +optional
	Result *OperationResult `json:"result,omitempty"`

	// startTime is when the operation started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// completionTime is when it succeeded or failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// OperationResult is the pair as an operation left it.
type OperationResult struct {
	// primary is the member that runs the VM.
	// +optional
	Primary *MemberStatus `json:"primary,omitempty"`
	// secondary is the synchronized secondary.
	// +optional
	Secondary *MemberStatus `json:"secondary,omitempty"`
	// epoch is the pair's record's epoch.
	// +kubebuilder:validation:Minimum=1
	// +optional
	Epoch int64 `json:"epoch,omitempty"`
}

// FaultTolerantVMOperation runs one of vSphere FT's operations on a FaultTolerantVM's pair, once:
// a test failover, a test restart of the secondary, or a migration of the secondary. Like a
// Job, it stays when done, as the record of what was done; operations on one FaultTolerantVM
// run one at a time, oldest first.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ftop;ftops,categories=lockstep
// +kubebuilder:validation:XValidation:rule="self.spec == oldSelf.spec",message="an operation's spec cannot change: create a new operation"
// +kubebuilder:printcolumn:name="FaultTolerantVM",type=string,JSONPath=`.spec.faultTolerantVMName`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FaultTolerantVMOperation struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the object's metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the operation.
	// +required
	Spec FaultTolerantVMOperationSpec `json:"spec,omitempty"`
	// status is what became of it.
	// +optional
	Status FaultTolerantVMOperationStatus `json:"status,omitempty"`
}

// Done says whether the operation ended.
func (o *FaultTolerantVMOperation) Done() bool {
	return o.Status.Phase == OperationSucceeded || o.Status.Phase == OperationFailed
}

// FaultTolerantVMOperationList is a list of FaultTolerantVMOperations.
//
// +kubebuilder:object:root=true
type FaultTolerantVMOperationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FaultTolerantVMOperation `json:"items"`
}
