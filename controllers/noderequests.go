package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	resourcehelper "k8s.io/component-helpers/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/internal/placement"
)

// launcherCreatedBy is the label KubeVirt puts on a launcher pod: the UID of its VMI.
const launcherCreatedBy = "kubevirt.io/created-by"

// NodeRequests is what the pods bound to each node request, as the scheduler counts them
// (component-helpers' PodRequests: containers, init and sidecar containers, overhead, pod-level
// resources), members' launcher pods included. Placement reads it on every decision, so it is
// kept up to date by an informer's events rather than summed over every pod each time.
type NodeRequests struct {
	mu     sync.RWMutex
	pods   map[types.UID]boundPod
	byNode map[string]placement.Resources
	// launchers counts the bound launcher pods of each VMI (by UID): such a member is counted
	// through its pod.
	launchers map[types.UID]int
	synced    func() bool
}

type boundPod struct {
	node     string
	vmi      types.UID
	requests placement.Resources
}

// NewNodeRequests starts counting the pods of an informer; HasSynced says when it has them all.
func NewNodeRequests(inf cache.Informer) (*NodeRequests, error) {
	r := &NodeRequests{pods: map[types.UID]boundPod{}, byNode: map[string]placement.Resources{}, launchers: map[types.UID]int{}}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.set(obj) },
		UpdateFunc: func(_, obj any) { r.set(obj) },
		DeleteFunc: r.forget,
	})
	if err != nil {
		return nil, err
	}
	r.synced = reg.HasSynced
	return r, nil
}

// NewNodeRequestsCache is a cache of the bound pods that have not ended, every namespace's,
// each cut to what the scheduler counts (trimPod): the operator's own cache holds only lockstep's
// launcher pods. The manager starts it with its other caches.
func NewNodeRequestsCache(mgr ctrl.Manager) (cache.Cache, error) {
	bound := fields.AndSelectors(
		fields.OneTermNotEqualSelector("spec.nodeName", ""),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)))
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Field: bound, Transform: trimPod}},
	})
	if err != nil {
		return nil, err
	}
	return c, mgr.Add(c)
}

// trimPod keeps of a pod what NodeRequests counts: a cluster's pods, whole, would be most of
// what the operator holds in memory.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName, Overhead: pod.Spec.Overhead, Resources: pod.Spec.Resources},
		Status:     corev1.PodStatus{Phase: pod.Status.Phase},
	}
	if vmi := pod.Labels[launcherCreatedBy]; vmi != "" {
		out.Labels = map[string]string{launcherCreatedBy: vmi}
	}
	for _, c := range pod.Spec.Containers {
		out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Resources: c.Resources})
	}
	for _, c := range pod.Spec.InitContainers {
		out.Spec.InitContainers = append(out.Spec.InitContainers, corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy})
	}
	return out, nil
}

// HasSynced says whether every bound pod has been counted once.
func (r *NodeRequests) HasSynced() bool { return r.synced == nil || r.synced() }

// Requested is what the pods bound to node request.
func (r *NodeRequests) Requested(node string) placement.Resources {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byNode[node]
}

// LauncherBound says whether a launcher pod of the VMI is bound to a node (and so counted there).
func (r *NodeRequests) LauncherBound(vmi types.UID) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.launchers[vmi] > 0
}

func (r *NodeRequests) set(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop(pod.UID)
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	req := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	b := boundPod{node: pod.Spec.NodeName, vmi: types.UID(pod.Labels[launcherCreatedBy]),
		requests: placement.Resources{MilliCPU: req.Cpu().MilliValue(), MemoryBytes: req.Memory().Value()}}
	r.pods[pod.UID] = b
	r.byNode[b.node] = r.byNode[b.node].Add(b.requests)
	if b.vmi != "" {
		r.launchers[b.vmi]++
	}
}

func (r *NodeRequests) forget(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop(pod.UID)
}

// drop uncounts a pod; the caller holds mu.
func (r *NodeRequests) drop(uid types.UID) {
	b, ok := r.pods[uid]
	if !ok {
		return
	}
	delete(r.pods, uid)
	left := r.byNode[b.node].Add(placement.Resources{MilliCPU: -b.requests.MilliCPU, MemoryBytes: -b.requests.MemoryBytes})
	if left == (placement.Resources{}) {
		delete(r.byNode, b.node)
	} else {
		r.byNode[b.node] = left
	}
	if b.vmi != "" {
		if r.launchers[b.vmi]--; r.launchers[b.vmi] <= 0 {
			delete(r.launchers, b.vmi)
		}
	}
}
