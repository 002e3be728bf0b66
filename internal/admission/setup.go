package admission

import (
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// Options are the cluster settings the webhooks judge by: the operator's own.
type Options struct {
	Limits                  placement.Limits
	DefaultLogBandwidthMbps int
	// COLO: members are COLO members (--colo): the template's disks must all be replicable, and the
	// secondary reserves the guest's memory twice.
	COLO bool
}

// Setup registers lockstep's webhooks with the manager's webhook server.
func Setup(mgr ctrl.Manager, opts Options) error {
	err := ctrl.NewWebhookManagedBy(mgr, &ftv1.FaultTolerantVM{}).
		WithDefaulter(FaultTolerantVMDefaulter{}).
		WithValidator(&FaultTolerantVMValidator{Reader: mgr.GetClient(), Claims: mgr.GetAPIReader(), Limits: opts.Limits, DefaultLogBandwidthMbps: opts.DefaultLogBandwidthMbps, COLO: opts.COLO}).
		Complete()
	if err != nil {
		return err
	}
	return ctrl.NewWebhookManagedBy(mgr, &virtv1.VirtualMachineInstanceMigration{}).
		WithValidator(&MigrationValidator{Reader: mgr.GetClient()}).
		Complete()
}
