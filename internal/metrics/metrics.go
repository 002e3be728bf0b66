// Package metrics holds the operator's Prometheus metrics, registered with controller-runtime's
// registry so that they are served with its own (reconcile counts and durations, work queues).
// The alerts in config/prometheus and the chart are written against these names.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
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

	// Unprotected is 1, labelled with the Protected condition's reason, while a running
	// FaultTolerantVM is not protected; it has no series while the VM is protected or halted.
	Unprotected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockstep_ftvm_unprotected",
		Help: "1 while a running FaultTolerantVM is not protected, labelled with why (the Protected condition's reason).",
	}, []string{"namespace", "name", "reason"})

	// Interval is the vLockstep interval lockstepd reports.
	Interval = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockstep_ftvm_vlockstep_interval_seconds",
		Help: "How far the secondary trails the primary, as lockstepd reports it in status.",
	}, []string{"namespace", "name"})

	// Bandwidth is the logging bandwidth lockstepd reports.
	Bandwidth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockstep_ftvm_log_bandwidth_bytes_per_second",
		Help: "FT logging traffic of the pair, as lockstepd reports it in status.",
	}, []string{"namespace", "name"})

	// Reprotection is how long VMs stayed unprotected before they were protected again.
	Reprotection = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockstep_ftvm_reprotection_seconds",
		Help:    "Time from a running FaultTolerantVM losing protection (a member lost, no node for a secondary) to Protected again.",
		Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600},
	})

	// PlacementFailures counts placements that found no eligible node.
	PlacementFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockstep_placement_failures_total",
		Help: "Placements of a member that found no eligible node (FT limit, logging bandwidth, anti-affinity, node health), by role.",
	}, []string{"role"})
)

// Nodes are the per-node series, as placement last saw the nodes (ObserveNodes).
var Nodes = &nodeCollector{
	budget: prometheus.NewDesc("lockstep_node_log_bandwidth_budget_mbps",
		"A node's FT logging bandwidth budget in Mbit/s (0: not budgeted), as placement last saw it.", []string{"node"}, nil),
	members: prometheus.NewDesc("lockstep_node_ft_members",
		"FT members (primaries and secondaries) on a node, as placement last saw it.", []string{"node"}, nil),
	limit: prometheus.NewDesc("lockstep_node_ft_members_limit",
		"A node's FT VM limit, as placement last saw it.", []string{"node"}, nil),
}

func init() {
	metrics.Registry.MustRegister(State, Failovers, Unprotected, Interval, Bandwidth, Reprotection, PlacementFailures,
		Nodes)
}

// unprotectedReason remembers each VM's labelled series, to delete it when the reason changes.
var unprotectedReason = struct {
	sync.Mutex
	m map[[2]string]string
}{m: map[[2]string]string{}}

// Observe records a FaultTolerantVM's state.
func Observe(ftvm *ftv1.FaultTolerantVM) {
	for _, s := range states {
		v := 0.0
		if ftvm.Status.State == s {
			v = 1
		}
		State.WithLabelValues(ftvm.Namespace, ftvm.Name, string(s)).Set(v)
	}
	reason := ""
	if c := apimeta.FindStatusCondition(ftvm.Status.Conditions, ftv1.ConditionProtected); c != nil && c.Status != "True" &&
		ftvm.Spec.RunStrategy != ftv1.RunStrategyHalted {
		reason = c.Reason
	}
	setUnprotected(ftvm.Namespace, ftvm.Name, reason)
	if d := ftvm.Status.VLockstepInterval; d != nil {
		Interval.WithLabelValues(ftvm.Namespace, ftvm.Name).Set(d.Seconds())
	} else {
		Interval.DeleteLabelValues(ftvm.Namespace, ftvm.Name)
	}
	if b := ftvm.Status.LogBandwidth; b != nil {
		Bandwidth.WithLabelValues(ftvm.Namespace, ftvm.Name).Set(b.AsApproximateFloat64())
	} else {
		Bandwidth.DeleteLabelValues(ftvm.Namespace, ftvm.Name)
	}
}

func setUnprotected(namespace, name, reason string) {
	unprotectedReason.Lock()
	defer unprotectedReason.Unlock()
	key := [2]string{namespace, name}
	if old, ok := unprotectedReason.m[key]; ok && old != reason {
		Unprotected.DeleteLabelValues(namespace, name, old)
		delete(unprotectedReason.m, key)
	}
	if reason != "" {
		Unprotected.WithLabelValues(namespace, name, reason).Set(1)
		unprotectedReason.m[key] = reason
	}
}

// ObserveNodes records what placement saw of each node; nodes it no longer sees lose their series.
func ObserveNodes(nodes []placement.Node) {
	seen := make([]nodeSeen, len(nodes))
	for i, n := range nodes {
		seen[i] = nodeSeen{name: n.Name, budget: n.Limits.LogBandwidthMbps, members: len(n.Members), limit: n.Limits.MaxMembers}
	}
	Nodes.mu.Lock()
	Nodes.seen = seen
	Nodes.mu.Unlock()
}

// nodeCollector serves the last view of the nodes when scraped. Placement sees every node on
// every decision, and rebuilding three labelled gauges of every node each time was a fifth of
// what the operator allocated at 500 nodes (make bench-scale); keeping the view is a small copy.
type nodeCollector struct {
	budget, members, limit *prometheus.Desc

	mu   sync.Mutex
	seen []nodeSeen
}

type nodeSeen struct {
	name                   string
	budget, members, limit int
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.budget
	ch <- c.members
	ch <- c.limit
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	seen := c.seen
	c.mu.Unlock()
	for _, n := range seen {
		ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, float64(n.budget), n.name)
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(n.members), n.name)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(n.limit), n.name)
	}
}

// Forget drops the series of a deleted FaultTolerantVM.
func Forget(namespace, name string) {
	for _, s := range states {
		State.DeleteLabelValues(namespace, name, string(s))
	}
	Failovers.DeleteLabelValues(namespace, name)
	setUnprotected(namespace, name, "")
	Interval.DeleteLabelValues(namespace, name)
	Bandwidth.DeleteLabelValues(namespace, name)
}
