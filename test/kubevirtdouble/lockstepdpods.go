package kubevirtdouble

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// The double is the kubelet of lockstepd's pods (kwok leaves their status alone: hack/kwokctl.yaml),
// as it is for the launcher pods: it runs the pod's lockstepd on the node's host, says so in the
// pod's status, sets the pod Ready from lockstepd's readiness probe (the DaemonSet's rollout
// waits on it), and stops lockstepd with SIGTERM when the pod is deleted, removing the pod once
// lockstepd has exited or its grace period ran out.

// probeEvery is how often the double asks lockstepd's readiness probe (the kubelet's
// periodSeconds, which the DaemonSet leaves at its default of 10 s: shorter here, so that the
// tests do not wait for it).
const probeEvery = 2 * time.Second

// tendLockstepdPods terminates the lockstepd pods of the node that are deleted and returns the
// one lockstepd should run as (nil: none yet).
func (h *Hosts) tendLockstepdPods(ctx context.Context, ho *Host) (*corev1.Pod, error) {
	var ds appsv1.DaemonSet
	if err := h.Get(ctx, h.DaemonSet, &ds); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	var pods corev1.PodList
	if err := h.List(ctx, &pods, client.InNamespace(h.DaemonSet.Namespace), client.MatchingLabels(ds.Spec.Selector.MatchLabels)); err != nil {
		return nil, err
	}
	// What this host runs, as of now: only terminate (which ends a stop) and lockstepd's exit
	// change it meanwhile, and each reconciles the node again.
	ho.mu.Lock()
	running, runningPod, stopping := ho.lockstepd != nil, ho.pod, ho.stopping
	ho.mu.Unlock()
	var current, deleted *corev1.Pod
	listed := false
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != ho.Node {
			continue
		}
		listed = listed || p.UID == runningPod
		switch {
		case p.DeletionTimestamp == nil:
			current = p
		case running && p.UID == runningPod:
			deleted = p.DeepCopy()
		default: // a deleted pod whose lockstepd does not run
			if err := h.removePod(ctx, p); err != nil {
				return nil, err
			}
		}
	}
	if running && !listed { // its pod went without a deletion the double saw
		deleted = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: h.DaemonSet.Namespace, Name: "(gone)", UID: runningPod}}
	}
	if deleted != nil && !stopping {
		ho.mu.Lock()
		ho.stopping = true
		ho.mu.Unlock()
		go h.terminate(ho, deleted)
		stopping = true
	}
	if stopping {
		return nil, nil // the next lockstepd starts once the last one is gone
	}
	return current, nil
}

// terminate stops the pod's lockstepd as the kubelet stops a deleted pod's container: SIGTERM,
// SIGKILL after the pod's grace period; then the pod goes.
func (h *Hosts) terminate(ho *Host, pod *corev1.Pod) {
	ho.mu.Lock()
	cmd := ho.lockstepd
	ho.mu.Unlock()
	grace := 30 * time.Second
	if g := pod.DeletionGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	} else if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	h.Log.Info("stopping lockstepd: its pod is deleted", "node", ho.Node, "pod", pod.Name, "grace", grace.String())
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		deadline := time.Now().Add(grace)
		for ho.lockstepdRunning() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if ho.lockstepdRunning() {
			h.Log.Info("lockstepd outlived its grace period: SIGKILL", "node", ho.Node, "pod", pod.Name)
			_ = cmd.Process.Kill()
			for ho.lockstepdRunning() {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.removePod(ctx, pod); err != nil {
		h.Log.Error(err, "removing a terminated lockstepd pod", "pod", pod.Name)
	}
	ho.mu.Lock()
	ho.stopping = false
	ho.mu.Unlock()
	h.requeue(ho.Node)
}

// removePod deletes a terminated pod for good, as the kubelet does once its containers stopped.
func (h *Hosts) removePod(ctx context.Context, pod *corev1.Pod) error {
	err := h.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// podRunning writes the pod's status as the kubelet does when its container starts: Running,
// not ready until its readiness probe says so, and its restarts counted.
func (h *Hosts) podRunning(ctx context.Context, ho *Host, pod *corev1.Pod) error {
	now := metav1.Now()
	st := &pod.Status
	restarts := int32(0)
	if st.Phase == corev1.PodRunning && len(st.ContainerStatuses) > 0 {
		restarts = st.ContainerStatuses[0].RestartCount + 1
	}
	st.Phase = corev1.PodRunning
	ip := fmt.Sprintf("10.216.%d.%d", ho.Index/256, ho.Index%256)
	st.HostIP, st.PodIP = ip, ip
	st.HostIPs, st.PodIPs = []corev1.HostIP{{IP: ip}}, []corev1.PodIP{{IP: ip}}
	if st.StartTime == nil {
		st.StartTime = &now
	}
	st.Conditions = podConditions(now, false)
	c := pod.Spec.Containers[0]
	st.ContainerStatuses = []corev1.ContainerStatus{{
		Name: c.Name, Image: c.Image, Ready: false, Started: ptr.To(true), RestartCount: restarts,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	return h.Status().Update(ctx, pod)
}

func podConditions(now metav1.Time, ready bool) []corev1.PodCondition {
	r := corev1.ConditionFalse
	if ready {
		r = corev1.ConditionTrue
	}
	return []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: r, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: r, LastTransitionTime: now},
	}
}

// probeReadiness asks lockstepd's readiness probe (the pod's readinessProbe, in the host's
// network namespace) every probeEvery until lockstepd exits, and writes each change into the pod's
// status; a lockstepd that exited is not ready.
func (h *Hosts) probeReadiness(ho *Host, pod *corev1.Pod, exited <-chan struct{}) {
	probe := pod.Spec.Containers[0].ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		h.Log.Info("lockstepd's pod has no HTTP readiness probe: it stays unready", "pod", pod.Name)
		return
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(probe.HTTPGet.Port.IntValue()))
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return testnet.DialContext(ctx, ho.NS, network, a)
		},
	}}
	ready := false
	set := func(r bool) {
		if ho.isCut() {
			return // its kubelet cannot write; it tries again once healed
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p := &corev1.Pod{}
		if err := h.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil || p.UID != pod.UID {
			return
		}
		p.Status.Conditions = podConditions(metav1.Now(), r)
		for i := range p.Status.ContainerStatuses {
			p.Status.ContainerStatuses[i].Ready = r
		}
		if err := h.Status().Update(ctx, p); err != nil {
			h.Log.Info("writing lockstepd's readiness into its pod; trying again", "pod", pod.Name, "err", err.Error())
			return
		}
		ready = r
		h.Log.Info("lockstepd's readiness", "node", ho.Node, "pod", pod.Name, "ready", r)
	}
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-exited:
			if ready {
				set(false)
			}
			return
		case <-t.C:
		}
		r := false
		if resp, err := hc.Get("http://" + addr + probe.HTTPGet.Path); err == nil {
			r = resp.StatusCode >= 200 && resp.StatusCode < 400
			_ = resp.Body.Close()
		}
		if r != ready || !ho.isCut() && h.podReadyInAPI(pod) != r {
			// A kubelet writes the pod's status again where the API server's differs from what
			// it sees: the node lifecycle controller marks every pod of a node not ready while
			// the node is NotReady (a node cut from the control plane), and only the kubelet
			// marks them ready again once it reaches the API server.
			set(r)
		}
	}
}

// podReadyInAPI is pod's Ready condition as the API server has it (false: gone, or not read).
func (h *Hosts) podReadyInAPI(pod *corev1.Pod) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := &corev1.Pod{}
	if err := h.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil || p.UID != pod.UID {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
