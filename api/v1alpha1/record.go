package v1alpha1

import "strings"

// The pair's record is a coordination.k8s.io Lease in the FaultTolerantVM's namespace, shared by
// the operator and lockstepd: its holder is the one member that may run the VM ("<node>/<vmi>"),
// its leaseTransitions the epoch. Whoever changes the holder does so by compare-and-set
// (the white paper's atomic test-and-set, 1.4), so exactly one decision wins, and a decider that
// restarts reads it back before it acts. The operator also counts promotions on it.
//
// The record is also a lease with a term (spec.leaseDurationSeconds): the side that runs the VM
// renews spec.renewTime; a holder that cannot renew pauses its VM
// before the term ends, and the operator moves the record away from a holder it cannot see only
// once it saw no renewal for the term (internal/term).
const (
	// AnnotationRenewedBy, on the record, is the identity ("<node>/<vmi>") that wrote its last
	// renewal (or claim).
	AnnotationRenewedBy = "ft.lockstep.dev/renewed-by"
	// AnnotationPromotions, on the record, counts the secondaries that took over.
	AnnotationPromotions = "ft.lockstep.dev/promotions"
	// AnnotationLastPromoted names the last member counted in AnnotationPromotions: the key that
	// keeps a retried count from counting twice.
	AnnotationLastPromoted = "ft.lockstep.dev/last-promoted"
	// AnnotationLastPromotionTime is when it was counted (RFC 3339).
	AnnotationLastPromotionTime = "ft.lockstep.dev/last-promotion-time"
	// AnnotationOperation is the UID of the last FaultTolerantVMOperation whose role change the
	// record carries (a test failover): written with the change itself, so that the operation is
	// done exactly once whoever crashes.
	AnnotationOperation = "ft.lockstep.dev/operation"
	// AnnotationReservedNode is the node that spec.protection Suspended keeps reserved for the
	// pair's secondary; written before the secondary is stopped.
	AnnotationReservedNode = "ft.lockstep.dev/reserved-node"
	// AnnotationLastOrdinal is the highest member ordinal handed out, written before a member of
	// that ordinal (or its disk copy) is created: a member's name names one VMI in the
	// FaultTolerantVM's life, also after a halt or a restart from disk removed every member.
	AnnotationLastOrdinal = "ft.lockstep.dev/last-ordinal"
	// AnnotationSuspectNodes lists the nodes where a member of the pair was lost or fenced and
	// which have not proved healthy since (JSON: node → what the operator saw of it then): no new
	// member of the pair goes there meanwhile. Written before the member is let go.
	AnnotationSuspectNodes = "ft.lockstep.dev/suspect-nodes"
	// AnnotationMembers lists the identities ("<node>/<vmi>", comma-separated) of the pair's
	// members and the nodes the operator placed them on, written before each is created. Only
	// the operator writes it: lockstepd's admission policy lets a lockstepd move the record only
	// to a member listed here on its own node, so a node cannot name another node's member.
	AnnotationMembers = "ft.lockstep.dev/members"
)

// RecordName is the name of a pair's record (its Lease).
func RecordName(ftvm string) string { return "ft-" + ftvm }

// SideIdentity names a member in the record: "<node>/<vmi>".
func SideIdentity(node, vmi string) string { return node + "/" + vmi }

// SplitIdentity is the node and the member VMI a record identity names (node "" when it names
// no node).
func SplitIdentity(identity string) (node, vmi string) {
	if node, vmi, ok := strings.Cut(identity, "/"); ok {
		return node, vmi
	}
	return "", identity
}

// VMIOfIdentity is the member VMI a record identity names.
func VMIOfIdentity(identity string) string {
	_, vmi := SplitIdentity(identity)
	return vmi
}

// lockstepd's node lease: a Lease in lockstepd's namespace by which lockstepd on a node says it
// runs there, renewed every NodeLeaseRenewSeconds (the kubelet's node lease, for lockstepd). Under
// COLO a member's state reaches it only through its node's lockstepd: the operator places members
// only on nodes whose lease is current, and takes a secondary on a node whose lease expired for
// one that may hold nothing to go live with.
const (
	// NodeLeaseDurationSeconds is how long a node lease holds unless renewed: longer than a
	// lockstepd restart (a rolling upgrade), shorter than the operator's node-lost grace.
	NodeLeaseDurationSeconds = 40
	// NodeLeaseRenewSeconds is how often lockstepd renews it.
	NodeLeaseRenewSeconds = 10
	// NodeLeaseHolderSuffix: the lease's holder is "<node>/lockstepd".
	NodeLeaseHolderSuffix = "lockstepd"
)

// NodeLeaseName is the name of node's lockstepd lease.
func NodeLeaseName(node string) string { return "lockstepd-" + node }
