package validation

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// Room is what a node could ever give one member, empty of other FT VMs: its FT limit and its
// allocatable CPU and memory.
type Room struct {
	Name   string
	Limits placement.Limits
	CPU    resource.Quantity
	Memory resource.Quantity
}

// ValidateRoom returns why no node could ever hold a member of the VM (its vCPUs above every
// node's FT vCPU limit, its memory or CPUs above every node's allocatable, its logging bandwidth
// above every node's budget), and warnings when only one node could: the pair needs two. With no
// nodes at all it only warns, so that a cluster can be set up in any order. With ramCache (COLO),
// the secondary reserves the guest's memory twice (member.reserveRAMCache), and a VM whose
// secondary no node could hold is refused too.
func ValidateRoom(ftvm *ftv1.FaultTolerantVM, logBandwidthMbps int, nodes []Room, ramCache bool) (field.ErrorList, []string) {
	if len(nodes) == 0 {
		return nil, []string{"the cluster has no nodes yet, so the VM's size was not checked against any node's FT limit or capacity"}
	}
	vmi := &ftvm.Spec.Template.Spec
	vcpus := member.VCPUs(vmi)
	mem, _ := member.GuestMemory(vmi)
	cpus := *resource.NewQuantity(int64(vcpus), resource.DecimalSI)

	var fit []string
	why := map[string]int{}
	for _, n := range nodes {
		switch {
		case n.Limits.MaxMembers < 1:
			why["the FT VM limit is 0"]++
		case vcpus > n.Limits.MaxVCPUs:
			why[fmt.Sprintf("the FT vCPU limit is %d", n.Limits.MaxVCPUs)]++
		case n.Limits.LogBandwidthMbps > 0 && logBandwidthMbps > n.Limits.LogBandwidthMbps:
			why[fmt.Sprintf("the logging bandwidth budget is %d Mbit/s", n.Limits.LogBandwidthMbps)]++
		case !n.Memory.IsZero() && mem.Cmp(n.Memory) > 0:
			why[fmt.Sprintf("it has %s of memory to allocate", n.Memory.String())]++
		case !n.CPU.IsZero() && cpus.Cmp(n.CPU) > 0:
			why[fmt.Sprintf("it has %s CPUs to allocate", n.CPU.String())]++
		default:
			fit = append(fit, n.Name)
		}
	}
	size := fmt.Sprintf("%d vCPUs, %s of memory, %d Mbit/s of logging", vcpus, mem.String(), logBandwidthMbps)
	switch len(fit) {
	case 0:
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "template", "spec", "domain"),
			fmt.Sprintf("no node can hold a member of this VM (%s): %s; make the VM smaller, or raise the FT limit (the operator's --max-ft-vcpus-per-node, or a node's %s annotation)",
				size, summarize(why), ftv1.AnnotationNodeMaxVCPUs))}, nil
	}
	if ramCache {
		secondary := mem.DeepCopy()
		secondary.Add(mem)
		most, room := resource.Quantity{}, false
		for _, n := range nodes {
			if !slices.Contains(fit, n.Name) {
				continue
			}
			room = room || n.Memory.IsZero() || secondary.Cmp(n.Memory) <= 0
			if n.Memory.Cmp(most) > 0 {
				most = n.Memory.DeepCopy()
			}
		}
		if !room {
			return field.ErrorList{field.Forbidden(field.NewPath("spec", "template", "spec", "domain", "memory"),
				fmt.Sprintf("no node can hold this VM's secondary: a COLO secondary reserves the guest's memory twice (%s: its RAM cache, a second copy of the guest's memory), and the nodes that could hold a member have at most %s to allocate; make the guest smaller or add memory",
					secondary.String(), most.String()))}, nil
		}
	}
	if len(fit) == 1 {
		return nil, []string{fmt.Sprintf("only node %s can hold a member of this VM (%s), and a pair needs two nodes: it will run NotProtected until another node can", fit[0], size)}
	}
	return nil, nil
}

// summarize lists each reason with how many nodes it holds for, most first.
func summarize(why map[string]int) string {
	reasons := make([]string, 0, len(why))
	for r := range why {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if why[reasons[i]] != why[reasons[j]] {
			return why[reasons[i]] > why[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		n := "nodes"
		if why[r] == 1 {
			n = "node"
		}
		parts[i] = fmt.Sprintf("%d %s where %s", why[r], n, r)
	}
	return strings.Join(parts, "; ")
}
