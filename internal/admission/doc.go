// Package admission serves lockstep's admission webhooks from the operator: the defaulting and
// validating webhooks of FaultTolerantVM, which run internal/validation's rules before an object
// is stored and add what only a look at the cluster can judge (the logging network, the nodes'
// FT limits and capacity), and the validating webhook that keeps KubeVirt's live migration away
// from FT members.
//
// Failure policies (config/webhook): FaultTolerantVM writes fail while no replica of the webhook
// answers (an object admitted unchecked could run a VM FT cannot protect); status writes, which
// lockstepd and the operator make, do not pass through it. Migrations are admitted while the
// webhook is down (a cluster's other VMs must keep migrating); the KubeVirt hook also refuses to
// make a member's migration target.
package admission
