package controllers

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// replicaCopy is a secondary's copy of volume, as the operator makes and marks it.
func replicaCopy(owner, volume, replicaOf, node string, ordinal int, follows string, bytes int64) corev1.PersistentVolumeClaim {
	c := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
		Name:   copyName(owner, volume),
		Labels: map[string]string{ftv1.LabelMember: owner, labelVolume: volume, ftv1.LabelNode: node},
		Annotations: map[string]string{ftv1.AnnotationOrdinal: strconv.Itoa(ordinal), ftv1.AnnotationFollows: follows,
			ftv1.AnnotationDiskBytes: strconv.FormatInt(bytes, 10)},
	}}
	if replicaOf != "" {
		c.Annotations[ftv1.AnnotationReplicaOf] = replicaOf
	}
	return c
}

// TestReusableReplicas: a new secondary takes over only the whole set of copies that one gone
// secondary of the same primary was synchronized with, on one node, of the primary's sizes.
func TestReusableReplicas(t *testing.T) {
	const gib = 1 << 30
	bytes := member.DiskBytes{"root": 10 * gib, "data": 2 * gib}
	volumes := []string{"data", "root"}
	set := func(owner, replicaOf, node string, ordinal int) []corev1.PersistentVolumeClaim {
		return []corev1.PersistentVolumeClaim{
			replicaCopy(owner, "root", replicaOf, node, ordinal, "vm-1", 10*gib),
			replicaCopy(owner, "data", replicaOf, node, ordinal, "vm-1", 2*gib),
		}
	}
	with := func(cs []corev1.PersistentVolumeClaim, i int, change func(*corev1.PersistentVolumeClaim)) []corev1.PersistentVolumeClaim {
		change(&cs[i])
		return cs
	}
	now := metav1.Now()
	cases := []struct {
		name    string
		copies  []corev1.PersistentVolumeClaim
		present []string
		want    string // the secondary whose copies are taken over; "" for none
		node    string
		tracked string // the secondary the primary last resynchronised: vm-2 unless set ("-": none)
	}{
		{name: "a gone secondary's copies, synchronized", copies: set("vm-2", "vm-2", "node-b", 2), want: "vm-2", node: "node-b"},
		{name: "its VMI is still being deleted", copies: set("vm-2", "vm-2", "node-b", 2), present: []string{"vm-2"}},
		{name: "never synchronized with them", copies: set("vm-2", "", "node-b", 2)},
		{name: "handed to vm-3, which never synchronized with them", copies: set("vm-3", "vm-2", "node-b", 3)},
		{name: "handed on and synchronized again", copies: set("vm-3", "vm-3", "node-b", 3), tracked: "vm-3", want: "vm-3", node: "node-b"},
		{name: "half handed over (a crash between the patches)", copies: with(set("vm-2", "vm-2", "node-b", 2), 0, func(c *corev1.PersistentVolumeClaim) {
			c.Labels[ftv1.LabelMember] = "vm-3"
		})},
		{name: "made for another primary's secondary", copies: with(set("vm-2", "vm-2", "node-b", 2), 1, func(c *corev1.PersistentVolumeClaim) {
			c.Annotations[ftv1.AnnotationFollows] = "vm-0"
		})},
		{name: "one was a primary's disk", copies: with(set("vm-2", "vm-2", "node-b", 2), 0, func(c *corev1.PersistentVolumeClaim) {
			c.Annotations[annotationWasPrimary] = annotationTrue
		})},
		{name: "one holds a disk of another size", copies: with(set("vm-2", "vm-2", "node-b", 2), 1, func(c *corev1.PersistentVolumeClaim) {
			c.Annotations[ftv1.AnnotationDiskBytes] = strconv.Itoa(3 * gib)
		})},
		{name: "one is on another node", copies: with(set("vm-2", "vm-2", "node-b", 2), 1, func(c *corev1.PersistentVolumeClaim) {
			c.Labels[ftv1.LabelNode] = "node-c"
		})},
		{name: "one has no node (made before copies named theirs)", copies: with(set("vm-2", "vm-2", "node-b", 2), 0, func(c *corev1.PersistentVolumeClaim) {
			delete(c.Labels, ftv1.LabelNode)
		})},
		{name: "one is being deleted", copies: with(set("vm-2", "vm-2", "node-b", 2), 0, func(c *corev1.PersistentVolumeClaim) {
			c.DeletionTimestamp = &now
		})},
		{name: "a volume missing", copies: set("vm-2", "vm-2", "node-b", 2)[:1]},
		{name: "two sets: the one the primary last resynchronised", copies: append(set("vm-2", "vm-2", "node-b", 2), set("vm-4", "vm-4", "node-c", 4)...), want: "vm-2", node: "node-b"},
		{name: "the primary resynchronised another since", copies: set("vm-2", "vm-2", "node-b", 2), tracked: "vm-5"},
		{name: "the primary's engine tracks none (its lockstepd restarted)", copies: set("vm-2", "vm-2", "node-b", 2), tracked: "-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			present := map[string]bool{}
			for _, p := range tc.present {
				present[p] = true
			}
			tracked := tc.tracked
			switch tracked {
			case "":
				tracked = "vm-2"
			case "-":
				tracked = ""
			}
			got, ok := reusableReplicas(tc.copies, "vm-1", tracked, present, volumes, bytes)
			if !ok {
				if tc.want != "" {
					t.Fatalf("none taken over; want %s's", tc.want)
				}
				return
			}
			if got.of != tc.want || got.node != tc.node || len(got.copies) != len(volumes) {
				t.Fatalf("took over %s's on %s (%d copies); want %q's on %s", got.of, got.node, len(got.copies), tc.want, tc.node)
			}
			for _, v := range volumes {
				if c := got.copies[v]; c == nil || c.Labels[labelVolume] != v {
					t.Fatalf("volume %s: copy %v", v, c)
				}
			}
		})
	}
}
