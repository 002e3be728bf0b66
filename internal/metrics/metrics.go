// Package metrics holds the operator's Prometheus metrics, registered with controller-runtime's
// registry so that they are served with its own (reconcile counts and durations, work queues).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

var states = []ftv1.FTState{ftv1.StateStarting, ftv1.StateProtected, ftv1.StateNotProtected, ftv1.StateFailingOver, ftv1.StateStopped}

var (
	// State is 1 for the FT state a FaultTolerantVM is in and 0 for the others.
	State = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockstep_ftvm_state",
		Help: "FT state of a FaultTolerantVM: 1 for its current state, 0 for the others.",
	}, []string{"namespace", "name", "state"})

	// Failovers counts promotions of a secondary.
	Failovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockstep_ftvm_failovers_total",
		Help: "Promotions of a secondary after its primary was lost.",
	}, []string{"namespace", "name"})
)

func init() {
	metrics.Registry.MustRegister(State, Failovers)
}

// Observe records a FaultTolerantVM's state.
func Observe(ftvm *ftv1.FaultTolerantVM) {
	for _, s := range states {
		v := 0.0
		if ftvm.Status.State == s {
			v = 1
		}
		State.WithLabelValues(ftvm.Namespace, ftvm.Name, string(s)).Set(v)
	}
}

// Forget drops the series of a deleted FaultTolerantVM.
func Forget(namespace, name string) {
	for _, s := range states {
		State.DeleteLabelValues(namespace, name, string(s))
	}
	Failovers.DeleteLabelValues(namespace, name)
}
