package lockstepd

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// collector reads every agent's status at scrape time, so that the metrics never disagree with
// the agents.
type collector struct{ d *Daemon }

var (
	metricLabels    = []string{"pair", "vmi"}
	descState       = prometheus.NewDesc("lockstepd_side_state", "1 for the state a side of a pair is in (Protected, Replicating, Claiming, Alone, Fenced, Lapsed), 0 for the others.", append(metricLabels, "state"), nil)
	descLapses      = prometheus.NewDesc("lockstepd_record_term_lapses_total", "Times the side could not renew the pair's record within its term and paused its VM (docs/operator.md, \"The record's term\").", metricLabels, nil)
	descInterval    = prometheus.NewDesc("lockstepd_vlockstep_interval_seconds", "How far the secondary trails the primary (moving average), measured on the primary.", metricLabels, nil)
	descBytes       = prometheus.NewDesc("lockstepd_log_bytes_total", "FT log entry bytes sent by the primary.", metricLabels, nil)
	descHeld        = prometheus.NewDesc("lockstepd_held_outputs", "Outputs waiting for the secondary's acknowledgement.", metricLabels, nil)
	descConn        = prometheus.NewDesc("lockstepd_connected", "1 while the side's FT log connection is up.", metricLabels, nil)
	descSilence     = prometheus.NewDesc("lockstepd_peer_last_heard_timestamp_seconds", "When the peer was last heard.", metricLabels, nil)
	descFailover    = prometheus.NewDesc("lockstepd_failovers_total", "Times this side went live after its primary was lost.", metricLabels, nil)
	descEpoch       = prometheus.NewDesc("lockstepd_epoch", "The pair's Lease epoch this side knows.", metricLabels, nil)
	descPace        = prometheus.NewDesc("lockstepd_pace_delay_seconds", "Delay added to each log append while the secondary trails too far.", metricLabels, nil)
	descCheckpoints = prometheus.NewDesc("lockstepd_checkpoints_total", "The engine's checkpoints by cause: periodic (due every checkpoint period), mismatch (the two sides' packets differed), timeout (the secondary's packet came after the compare timeout), unparsed (a packet of the primary that colo-compare cannot compare, such as IPv6 or ARP, held until a checkpoint), or forced (one of those, with a QEMU that does not say which). Mostly forced checkpoints mean that the VM's replies wait for checkpoints.", append(metricLabels, "cause"), nil)
	descPause       = prometheus.NewDesc("lockstepd_checkpoint_pause_seconds", "How long the primary's VM stands still for a checkpoint (moving average).", metricLabels, nil)
	descUnparsed    = prometheus.NewDesc("lockstepd_colo_unparsed_held_packets_total", "Packets of the primary that colo-compare could not compare (IPv6, ARP: anything but IPv4) and held until the next checkpoint.", metricLabels, nil)
	descResyncDone  = prometheus.NewDesc("lockstepd_resync_done_bytes", "While the primary copies its disks into a new secondary: what is copied, of all its replicated disks together.", metricLabels, nil)
	descResyncTotal = prometheus.NewDesc("lockstepd_resync_total_bytes", "While the primary copies its disks into a new secondary: what there is to copy (QEMU's estimate, which grows when the guest writes where the copy has passed).", metricLabels, nil)
	descRefused     = prometheus.NewDesc("lockstepd_peers_refused_total", "Connections to this node's FT log and streams refused because the peer's certificate is not the node of the pair's other member.", nil, nil)
	descAwaited     = prometheus.NewDesc("lockstepd_reprotection_awaited_vms", "VMs this node held protected when the last lockstepd on it stopped that are not protected again yet: lockstepd is not ready (a rollout of its DaemonSet waits) while it is above 0, up to --reprotection-timeout.", nil, nil)
	descCertExpiry  = prometheus.NewDesc("lockstepd_certificate_expiration_timestamp_seconds", "When the node certificate that lockstepd serves expires. lockstepd renews it at two thirds of its lifetime; once it expires, peers refuse the node.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descLapses, descInterval, descBytes, descHeld, descConn, descSilence, descFailover, descEpoch, descPace, descCheckpoints, descPause, descUnparsed, descResyncDone, descResyncTotal, descRefused, descCertExpiry, descAwaited} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(c.d.Node.Refused()))
	if c.d.reprotection != nil {
		ch <- prometheus.MustNewConstMetric(descAwaited, prometheus.GaugeValue, float64(c.d.reprotection.Awaited()))
	}
	if c.d.certs != nil {
		if at, err := c.d.certs.notAfter(); err == nil {
			ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(at.Unix()))
		}
	}
	for _, st := range c.d.Statuses() {
		l := []string{st.Pair, vmiOf(st.Identity)}
		for s := failover.Protected; s <= failover.Lapsed; s++ {
			v := 0.0
			if s == st.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, append(l, s.String())...)
		}
		ch <- prometheus.MustNewConstMetric(descLapses, prometheus.CounterValue, float64(st.Lapses), l...)
		ch <- prometheus.MustNewConstMetric(descInterval, prometheus.GaugeValue, st.Interval.Seconds(), l...)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.BytesLogged), l...)
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(st.Held), l...)
		conn := 0.0
		if st.Connected {
			conn = 1
		}
		ch <- prometheus.MustNewConstMetric(descConn, prometheus.GaugeValue, conn, l...)
		if !st.LastHeard.IsZero() {
			ch <- prometheus.MustNewConstMetric(descSilence, prometheus.GaugeValue, float64(st.LastHeard.UnixNano())/1e9, l...)
		}
		ch <- prometheus.MustNewConstMetric(descFailover, prometheus.CounterValue, float64(st.Failovers), l...)
		ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(st.Epoch), l...)
		ch <- prometheus.MustNewConstMetric(descPace, prometheus.GaugeValue, st.PaceDelay.Seconds(), l...)
		if st.Checkpoints > 0 {
			for cause, n := range checkpointCauses(st) {
				ch <- prometheus.MustNewConstMetric(descCheckpoints, prometheus.CounterValue, float64(n), append(l, cause)...)
			}
			ch <- prometheus.MustNewConstMetric(descPause, prometheus.GaugeValue, st.CheckpointPause.Seconds(), l...)
		}
		if st.CheckpointCausesKnown {
			ch <- prometheus.MustNewConstMetric(descUnparsed, prometheus.CounterValue, float64(st.UnparsedHeld), l...)
		}
		if !st.Resync.Started.IsZero() {
			ch <- prometheus.MustNewConstMetric(descResyncDone, prometheus.GaugeValue, float64(st.Resync.Done), l...)
			ch <- prometheus.MustNewConstMetric(descResyncTotal, prometheus.GaugeValue, float64(st.Resync.Total), l...)
		}
	}
}

// checkpointCauses splits a side's checkpoints by cause: periodic, mismatch, timeout, unparsed and
// crossed when the engine tells its forced ones apart, periodic and forced otherwise.
func checkpointCauses(st agent.Status) map[string]uint64 {
	periodic := st.Checkpoints - min(st.ForcedCheckpoints, st.Checkpoints)
	if !st.CheckpointCausesKnown {
		return map[string]uint64{"periodic": periodic, "forced": st.ForcedCheckpoints}
	}
	return map[string]uint64{"periodic": periodic, "mismatch": st.CheckpointsOnMismatch, "timeout": st.CheckpointsOnTimeout, "unparsed": st.CheckpointsOnUnparsed, "crossed": st.CheckpointsOnCrossed}
}

func registerMetrics(d *Daemon) {
	_ = metrics.Registry.Register(collector{d})
}
