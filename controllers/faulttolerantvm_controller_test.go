package controllers_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/arbiter"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/internal/term"
)

var _ = Describe("FaultTolerantVM", func() {
	var ns string

	BeforeEach(func() {
		ns = newNamespace()
	})
	AfterEach(func() {
		deleteAllFTVMs(ns)
		deleteAllNodes()
	})

	Context("on a healthy cluster", func() {
		BeforeEach(func() {
			for i, zone := range []string{"zone-a", "zone-a", "zone-b"} {
				makeNode(fmt.Sprintf("node-%d", i+1), zone)
			}
		})

		It("runs a primary and a secondary on two nodes, with anti-affinity and full reservations, and keeps the guest off the logging network", func() {
			ftvm := newFTVM(ns, "mail-01")
			ftvm.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 2}
			Expect(k8s.Create(ctx(), ftvm)).To(Succeed())

			got := waitForState(ns, "mail-01", ftv1.StateProtected)
			Expect(got.Status.Primary).NotTo(BeNil())
			Expect(got.Status.Secondary).NotTo(BeNil())
			Expect(got.Status.Primary.Node).NotTo(Equal(got.Status.Secondary.Node))
			Expect(got.Status.Primary.VMI).To(Equal("mail-01-1"))
			Expect(got.Status.Secondary.VMI).To(Equal("mail-01-2"))
			Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
			Expect(got.Finalizers).To(ContainElement(ftv1.Finalizer))
			for _, typ := range []string{ftv1.ConditionValid, ftv1.ConditionPrimaryReady, ftv1.ConditionSecondaryReady, ftv1.ConditionProtected} {
				Expect(condition(got, typ).Status).To(Equal(metav1.ConditionTrue), typ)
			}
			Expect(condition(got, ftv1.ConditionRestartRequired).Status).To(Equal(metav1.ConditionFalse))

			var vmis []virtv1.VirtualMachineInstance
			Eventually(func() int { vmis = members(ns, "mail-01"); return len(vmis) }, timeout, interval).Should(Equal(2))
			macs := map[string]bool{}
			for _, v := range vmis {
				By("member " + v.Name)
				Expect(metav1.IsControlledBy(&v, got)).To(BeTrue())
				Expect(v.Labels).To(HaveKeyWithValue("app", "mail-01"))
				Expect(v.Labels).To(HaveKeyWithValue(ftv1.LabelPair, "mail-01"))
				Expect(v.Labels[ftv1.LabelRole]).To(BeElementOf(ftv1.RolePrimary, ftv1.RoleSecondary))

				// Full reservations: guest memory == request == limit; CPU request == limit == vCPUs.
				res := v.Spec.Domain.Resources
				Expect(v.Spec.Domain.Memory.Guest.String()).To(Equal("1Gi"))
				Expect(res.Requests.Memory().String()).To(Equal("1Gi"))
				Expect(res.Limits.Memory().String()).To(Equal("1Gi"))
				Expect(res.Requests.Cpu().String()).To(Equal("2"))
				Expect(res.Limits.Cpu().String()).To(Equal("2"))
				Expect(*v.Spec.EvictionStrategy).To(Equal(virtv1.EvictionStrategyExternal))
				Expect(v.Spec.PriorityClassName).To(Equal("lockstep-ft"))

				// Pinned to the node placement chose, and kept apart from the other member.
				node := v.Labels[ftv1.LabelNode]
				terms := v.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				Expect(terms).To(HaveLen(1))
				Expect(terms[0].MatchFields).To(ContainElement(corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}))
				anti := v.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
				Expect(anti).To(ContainElement(corev1.PodAffinityTerm{
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{ftv1.LabelPair: "mail-01"}},
					TopologyKey:   corev1.LabelHostname,
				}))

				// The logging network is lockstepd's: the guest has no NIC on it.
				for _, n := range v.Spec.Networks {
					Expect(n.Multus == nil || n.Multus.NetworkName != ns+"/ft-logging").To(BeTrue(), "a guest NIC on the logging network: %+v", n)
				}
				Expect(v.Spec.Domain.Devices.Interfaces).NotTo(ContainElement(HaveField("Name", member.LoggingInterfaceName)))

				// Both members present the same hardware to the guest.
				Expect(v.Spec.Domain.Firmware.UUID).To(Equal(got.UID))
				for _, iface := range v.Spec.Domain.Devices.Interfaces {
					if iface.Name == "default" {
						macs[iface.MacAddress] = true
					}
				}
			}
			Expect(macs).To(HaveLen(1))

			Eventually(func() []string { return eventReasons(ns, "mail-01") }, timeout, interval).Should(ContainElements(ftv1.ReasonMemberCreated, ftv1.ReasonProtected))
			// One event for the new pair, naming both members and their nodes.
			created := eventMessages(ns, "mail-01", ftv1.ReasonMemberCreated)
			Expect(strings.Split(created, "\n")).To(HaveLen(1), "MemberCreated events: %s", created)
			Expect(created).To(MatchRegexp(`^primary mail-01-\d+ placed on node \S+, secondary mail-01-\d+ on node \S+$`))
		})

		It("keeps pairs of the same name in different namespaces apart only from their own partner", func() {
			// Two nodes, two VMs named alike: each pair must use both nodes.
			Expect(k8s.Delete(ctx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName("node-3")}})).To(Succeed())
			other := newNamespace()
			Expect(k8s.Create(ctx(), newFTVM(ns, "twin"))).To(Succeed())
			Expect(k8s.Create(ctx(), newFTVM(other, "twin"))).To(Succeed())
			waitForState(ns, "twin", ftv1.StateProtected)
			waitForState(other, "twin", ftv1.StateProtected)
			deleteAllFTVMs(other)
		})

		It("keeps members in different zones when asked", func() {
			ftvm := newFTVM(ns, "zoned")
			ftvm.Spec.TopologyKey = corev1.LabelTopologyZone
			Expect(k8s.Create(ctx(), ftvm)).To(Succeed())
			got := waitForState(ns, "zoned", ftv1.StateProtected)
			zoneOf := func(node string) string {
				n := &corev1.Node{}
				Expect(k8s.Get(ctx(), types.NamespacedName{Name: node}, n)).To(Succeed())
				return n.Labels[corev1.LabelTopologyZone]
			}
			Expect(zoneOf(got.Status.Primary.Node)).NotTo(Equal(zoneOf(got.Status.Secondary.Node)))
			v, err := getVMI(ns, got.Status.Secondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			Expect(v.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(ContainElement(HaveField("TopologyKey", corev1.LabelTopologyZone)))
		})

		It("shows state, nodes, interval and bandwidth as printer columns", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "cols"))).To(Succeed())
			got := waitForState(ns, "cols", ftv1.StateProtected)
			// lockstepd reports these; set them as it would.
			base := got.DeepCopy()
			got.Status.VLockstepInterval = &metav1.Duration{Duration: 10 * time.Millisecond}
			q := resource.MustParse("83k")
			got.Status.LogBandwidth = &q
			Expect(k8s.Status().Patch(ctx(), got, client.MergeFrom(base))).To(Succeed())

			table := getTable(ns, "cols")
			var names []string
			for _, c := range table.ColumnDefinitions {
				names = append(names, c.Name)
			}
			Expect(names).To(Equal([]string{"Name", "State", "Primary", "Secondary", "Interval", "Bandwidth", "Failovers", "Epoch", "Age"}))
			Expect(table.Rows).To(HaveLen(1))
			cells := table.Rows[0].Cells
			Expect(cells[0:6]).To(Equal([]interface{}{"cols", "Protected", got.Status.Primary.Node, got.Status.Secondary.Node, "10ms", "83k"}))
		})

		It("stops both members when halted and starts them again when running", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "halt"))).To(Succeed())
			waitForState(ns, "halt", ftv1.StateProtected)
			patchRunStrategy(ns, "halt", ftv1.RunStrategyHalted)
			got := waitForState(ns, "halt", ftv1.StateStopped)
			Eventually(func() int { return len(members(ns, "halt")) }, timeout, interval).Should(BeZero())
			Expect(condition(got, ftv1.ConditionProtected).Reason).To(Equal(ftv1.ReasonHalted))
			patchRunStrategy(ns, "halt", ftv1.RunStrategyRunning)
			again := waitForState(ns, "halt", ftv1.StateProtected)
			Expect([]string{again.Status.Primary.VMI, again.Status.Secondary.VMI}).To(Equal([]string{"halt-3", "halt-4"}),
				"a member's name is never used twice, also once every member is gone")
		})

		It("reports RestartRequired when the template changes, and leaves the members alone", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "upd"))).To(Succeed())
			waitForState(ns, "upd", ftv1.StateProtected)
			before := members(ns, "upd")
			ftvm := getFTVM(ns, "upd")
			base := ftvm.DeepCopy()
			ftvm.Spec.Template.Metadata.Labels["tier"] = "gold"
			Expect(k8s.Patch(ctx(), ftvm, client.MergeFrom(base))).To(Succeed())
			Eventually(func() metav1.ConditionStatus {
				return condition(getFTVM(ns, "upd"), ftv1.ConditionRestartRequired).Status
			}, timeout, interval).Should(Equal(metav1.ConditionTrue))
			Expect(getFTVM(ns, "upd").Status.State).To(Equal(ftv1.StateProtected))
			Expect(resourceVersions(members(ns, "upd"))).To(Equal(resourceVersions(before)))
		})

		It("gives the secondary its own blank copy of each persistent disk", func() {
			class := "fast"
			Expect(k8s.Create(ctx(), &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "db-root", Namespace: ns},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &class,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("20Gi")}},
				},
			})).To(Succeed())
			ftvm := newFTVM(ns, "db")
			ftvm.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-root"}}}
			Expect(k8s.Create(ctx(), ftvm)).To(Succeed())
			got := waitForState(ns, "db", ftv1.StateProtected)

			claimOf := func(vmi string) string {
				v, err := getVMI(ns, vmi)
				Expect(err).NotTo(HaveOccurred())
				return v.Spec.Volumes[0].PersistentVolumeClaim.ClaimName
			}
			Expect(claimOf(got.Status.Primary.VMI)).To(Equal("db-root"))
			copyName := claimOf(got.Status.Secondary.VMI)
			Expect(copyName).To(Equal("db-2-root"))
			pvc := &corev1.PersistentVolumeClaim{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: copyName}, pvc)).To(Succeed())
			Expect(*pvc.Spec.StorageClassName).To(Equal("fast"))
			Expect(pvc.Spec.Resources.Requests.Storage().String()).To(Equal("20Gi"))
			Expect(pvc.Annotations).To(HaveKeyWithValue(ftv1.AnnotationSourceClaim, "db-root"))
			Expect(metav1.IsControlledBy(pvc, got)).To(BeTrue())
		})

		It("waits for a logging network that went away after admission, and creates one from the given config", func() {
			otherNet := func() *nadv1.NetworkAttachmentDefinition {
				return &nadv1.NetworkAttachmentDefinition{
					ObjectMeta: metav1.ObjectMeta{Name: "other-net", Namespace: ns},
					Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.3.1","type":"bridge"}`},
				}
			}
			// Admission refuses a missing network, so it goes after the VM is admitted (halted).
			Expect(k8s.Create(ctx(), otherNet())).To(Succeed())
			ftvm := newFTVM(ns, "nonet")
			ftvm.Spec.LoggingNetwork.Name = "other-net"
			ftvm.Spec.RunStrategy = ftv1.RunStrategyHalted
			Expect(k8s.Create(ctx(), ftvm)).To(Succeed())
			Expect(k8s.Delete(ctx(), otherNet())).To(Succeed())
			Eventually(func() error {
				got := getFTVM(ns, "nonet")
				got.Spec.RunStrategy = ftv1.RunStrategyRunning
				return k8s.Update(ctx(), got)
			}, timeout, interval).Should(Succeed())
			Eventually(func() string {
				c := condition(getFTVM(ns, "nonet"), ftv1.ConditionPrimaryReady)
				if c == nil {
					return ""
				}
				return c.Reason
			}, timeout, interval).Should(Equal(ftv1.ReasonLoggingNetworkNotFound))
			Consistently(func() int { return len(members(ns, "nonet")) }, time.Second, interval).Should(BeZero())

			withConfig := newFTVM(ns, "mknet")
			withConfig.Spec.LoggingNetwork = ftv1.LoggingNetwork{Name: "made-net", Config: `{"cniVersion":"0.3.1","type":"bridge"}`}
			Expect(k8s.Create(ctx(), withConfig)).To(Succeed())
			waitForState(ns, "mknet", ftv1.StateProtected)
			nad := &nadv1.NetworkAttachmentDefinition{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "made-net"}, nad)).To(Succeed())
			Expect(nad.Spec.Config).To(ContainSubstring(`"bridge"`))

			By("creating the missing network, the waiting VM starts")
			Expect(k8s.Create(ctx(), otherNet())).To(Succeed())
			waitForState(ns, "nonet", ftv1.StateProtected)
		})

		It("releases the pair's record before its members go when it is deleted: the secondary can no longer win it", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "going"))).To(Succeed())
			got := waitForState(ns, "going", ftv1.StateProtected)
			key := types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("going")}
			before := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx(), key, before)).To(Succeed())
			// The secondary's VMI lingers (its node does not answer): the deletion waits for it.
			sec, err := getVMI(ns, got.Status.Secondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			sec.Finalizers = append(sec.Finalizers, "test.lockstep.dev/lingers")
			Expect(k8s.Update(ctx(), sec)).To(Succeed())
			Expect(k8s.Delete(ctx(), got)).To(Succeed())
			Eventually(isGone(ns, got.Status.Primary.VMI), timeout, interval).Should(BeTrue())
			after := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx(), key, after)).To(Succeed())
			Expect(ptr.Deref(after.Spec.HolderIdentity, "")).To(BeEmpty())
			Expect(*after.Spec.LeaseTransitions).To(Equal(*before.Spec.LeaseTransitions + 1))
			// The secondary's lockstepd stops hearing its primary and claims the epoch it knew.
			arb := &arbiter.Arbiter{Client: k8s, Lease: key, Identity: got.Status.Secondary.Node + "/" + got.Status.Secondary.VMI}
			_, err = arb.Claim(ctx(), uint64(*before.Spec.LeaseTransitions))
			Expect(err).To(MatchError(arbiter.ErrLost))
			// The secondary goes at last, and the deletion ends.
			Expect(k8s.Get(ctx(), client.ObjectKeyFromObject(sec), sec)).To(Succeed())
			sec.Finalizers = nil
			Expect(k8s.Update(ctx(), sec)).To(Succeed())
			Eventually(isGone(ns, sec.Name), timeout, interval).Should(BeTrue())
		})

		It("keeps a logging network it created while a pod attaches it when it is deleted", func() {
			f := newFTVM(ns, "mknet")
			f.Spec.LoggingNetwork = ftv1.LoggingNetwork{Name: "made-net", Config: `{"cniVersion":"0.3.1","type":"bridge"}`}
			Expect(k8s.Create(ctx(), f)).To(Succeed())
			waitForState(ns, "mknet", ftv1.StateProtected)
			// A lockstepd-like pod attaches it (its DaemonSet names the logging network).
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lockstepd-x", Namespace: ns,
				Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": ns + "/made-net@ftlog"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "lockstepd"}}}}
			Expect(k8s.Create(ctx(), pod)).To(Succeed())
			Expect(k8s.Delete(ctx(), getFTVM(ns, "mknet"))).To(Succeed())
			Eventually(func() bool {
				err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "mknet"}, &ftv1.FaultTolerantVM{})
				return apierrors.IsNotFound(err)
			}, timeout, interval).Should(BeTrue())
			nad := &nadv1.NetworkAttachmentDefinition{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "made-net"}, nad)).To(Succeed())
			Expect(nad.DeletionTimestamp).To(BeNil(), "deleted under a pod that attaches it")
			Expect(k8s.Delete(ctx(), pod, client.GracePeriodSeconds(0))).To(Succeed())
			Expect(k8s.Delete(ctx(), nad)).To(Succeed()) // nothing releases it once the pod goes: the user does
		})

		It("deletes its members when it is deleted", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "gone"))).To(Succeed())
			got := waitForState(ns, "gone", ftv1.StateProtected)
			Expect(k8s.Delete(ctx(), got)).To(Succeed())
			Eventually(isGone(ns, got.Status.Primary.VMI), timeout, interval).Should(BeTrue())
			Eventually(isGone(ns, got.Status.Secondary.VMI), timeout, interval).Should(BeTrue())
			Eventually(func() bool {
				err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "gone"}, &ftv1.FaultTolerantVM{})
				return client.IgnoreNotFound(err) == nil && err != nil
			}, timeout, interval).Should(BeTrue())
		})
	})

	Context("when a node is lost", func() {
		var got *ftv1.FaultTolerantVM
		BeforeEach(func() {
			for i := 1; i <= 3; i++ {
				makeNode(fmt.Sprintf("node-%d", i), "zone-a")
			}
			Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
			got = waitForState(ns, "vm", ftv1.StateProtected)
		})

		It("promotes the secondary when the primary's node goes NotReady, and starts a new secondary elsewhere", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// The record lists each member on the node it was placed on (lockstepd's admission
			// policy lets a node's lockstepd name only those of its node), and only the pair's.
			listed := func() []string {
				l := &coordinationv1.Lease{}
				Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, l)).To(Succeed())
				return strings.Split(l.Annotations[ftv1.AnnotationMembers], ",")
			}
			Expect(listed()).To(ConsistOf(ftv1.SideIdentity(oldPrimary.Node, oldPrimary.VMI), ftv1.SideIdentity(oldSecondary.Node, oldSecondary.VMI)))
			setNodeReady(oldPrimary.Node, false)

			Eventually(isGone(ns, oldPrimary.VMI), timeout, interval).Should(BeTrue())
			after := waitFor(ns, "vm", "protected by a new secondary", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != oldSecondary.VMI
			})
			Expect(after.Status.Primary.VMI).To(Equal(oldSecondary.VMI), "the secondary is promoted, not restarted")
			Expect(after.Status.Primary.Node).To(Equal(oldSecondary.Node))
			Expect(after.Status.Secondary.VMI).To(Equal("vm-3"))
			Expect(after.Status.Secondary.Node).NotTo(BeElementOf(oldPrimary.Node, oldSecondary.Node))
			Expect(listed()).To(ConsistOf(ftv1.SideIdentity(oldSecondary.Node, oldSecondary.VMI), ftv1.SideIdentity(after.Status.Secondary.Node, "vm-3")),
				"the new secondary listed before it was created, the lost primary no longer")
			Expect(after.Status.FailoverCount).To(Equal(int32(1)))
			Expect(after.Status.LastFailoverTime).NotTo(BeNil())
			promoted, err := getVMI(ns, oldSecondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			Expect(promoted.Labels[ftv1.LabelRole]).To(Equal(ftv1.RolePrimary))
			Expect(promoted.Status.Phase).To(Equal(virtv1.Running))
			Expect(eventReasons(ns, "vm")).To(ContainElement(ftv1.ReasonPromoted))
			Expect(failoverMetric(ns, "vm")).To(Equal(1.0))
		})

		It("relabels the promoted member's launcher pod, so that a Service of the primary follows the VM", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// What KubeVirt makes for the secondary: a launcher pod with the VMI's labels, as
			// they were when it was created.
			vmi, err := getVMI(ns, oldSecondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			labels := map[string]string{virtv1.CreatedByLabel: string(vmi.UID)}
			for k, v := range vmi.Labels {
				labels[k] = v
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-launcher-" + vmi.Name, Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}}}}
			Expect(k8s.Create(ctx(), pod)).To(Succeed())
			Expect(pod.Labels[ftv1.LabelRole]).To(Equal(ftv1.RoleSecondary))

			setNodeReady(oldPrimary.Node, false)
			Eventually(func() string {
				p := &corev1.Pod{}
				Expect(k8s.Get(ctx(), client.ObjectKeyFromObject(pod), p)).To(Succeed())
				return p.Labels[ftv1.LabelRole]
			}, timeout, interval).Should(Equal(ftv1.RolePrimary))
			Expect(k8s.Delete(ctx(), pod)).To(Succeed())
		})

		It("promotes the secondary as soon as lockstepd reports it live, before the node lifecycle sees anything", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// What the secondary's lockstepd writes once it won the pair's Lease.
			patch := fmt.Sprintf(`{"status":{"replication":{"primary":{"vmi":%q,"node":%q,"state":"Alone","epoch":3,"reportTime":%q}}}}`,
				oldSecondary.VMI, oldSecondary.Node, time.Now().UTC().Format(time.RFC3339))
			Expect(k8s.Status().Patch(ctx(), getFTVM(ns, "vm"), client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())

			Eventually(isGone(ns, oldPrimary.VMI), timeout, interval).Should(BeTrue())
			after := waitFor(ns, "vm", "protected by a new secondary", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != oldSecondary.VMI
			})
			Expect(after.Status.Primary.VMI).To(Equal(oldSecondary.VMI), "the live secondary is promoted")
			Expect(after.Status.FailoverCount).To(Equal(int32(1)))
			Expect(eventMessages(ns, "vm", ftv1.ReasonPromoted)).To(ContainSubstring("lockstepd reports secondary " + oldSecondary.VMI))
			// The old primary's node still looks Ready to the API server, but it just lost the
			// primary (its host may be dying): the new secondary goes elsewhere.
			Expect(after.Status.Secondary.Node).NotTo(Equal(oldPrimary.Node))
		})

		It("keeps a node that lost the primary suspect after the member is gone, until the node proves healthy", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// Only the old primary's node is left for a new secondary.
			for i := 1; i <= 3; i++ {
				if n := nodeName(fmt.Sprintf("node-%d", i)); n != oldPrimary.Node && n != oldSecondary.Node {
					Expect(k8s.Delete(ctx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
				}
			}
			// The old primary's kubelet renews its lease, until its host dies (below).
			holder := oldPrimary.Node
			kubeletLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: oldPrimary.Node},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: time.Now()}}}
			Expect(k8s.Create(ctx(), kubeletLease)).To(Succeed())
			DeferCleanup(func() { _ = k8s.Delete(ctx(), kubeletLease) })
			// The primary's host dies: its secondary's lockstepd claims the pair's Lease, before it
			// reports anything in the status (as in make demo). The node still reads Ready: nobody
			// has told the API server yet.
			key := types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}
			rec := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx(), key, rec)).To(Succeed())
			claimer := &arbiter.Arbiter{Client: k8s, Lease: key, Identity: oldSecondary.Node + "/" + oldSecondary.VMI}
			_, err := claimer.Claim(ctx(), uint64(*rec.Spec.LeaseTransitions))
			Expect(err).NotTo(HaveOccurred())
			Eventually(isGone(ns, oldPrimary.VMI), timeout, interval).Should(BeTrue())
			record := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, record)).To(Succeed())
			Expect(record.Annotations[ftv1.AnnotationSuspectNodes]).To(ContainSubstring(oldPrimary.Node))
			// Reconcile after reconcile, with the fenced member long gone, nothing goes there.
			Consistently(func(g Gomega) {
				for _, m := range members(ns, "vm") {
					g.Expect(m.Labels[ftv1.LabelNode]).NotTo(Equal(oldPrimary.Node), "a member placed on the node that just lost the primary")
				}
			}, 4*time.Second, interval).Should(Succeed())
			Expect(condition(getFTVM(ns, "vm"), ftv1.ConditionSecondaryReady).Message).To(ContainSubstring("has not proved healthy"))

			// The node comes back: its kubelet renews its lease. The secondary may go there now.
			Expect(k8s.Get(ctx(), client.ObjectKeyFromObject(kubeletLease), kubeletLease)).To(Succeed())
			kubeletLease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			Expect(k8s.Update(ctx(), kubeletLease)).To(Succeed())
			after := waitFor(ns, "vm", "protected by a new secondary on the node that proved healthy", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.Node == oldPrimary.Node
			})
			Expect(after.Status.Primary.VMI).To(Equal(oldSecondary.VMI))
		})

		It("keeps a primary whose node went silent while its lockstepd reports it replicating, and fails over once the reports stop", func() {
			p, sec := got.Status.Primary, got.Status.Secondary
			// What the primary's lockstepd writes every few seconds while the pair replicates:
			// its node lost only its heartbeat to the API server.
			report := func() {
				patch := fmt.Sprintf(`{"status":{"replication":{"primary":{"vmi":%q,"node":%q,"state":"Protected","epoch":%d,"reportTime":%q}}}}`,
					p.VMI, p.Node, got.Status.Epoch, time.Now().UTC().Format(time.RFC3339Nano))
				Expect(k8s.Status().Patch(ctx(), getFTVM(ns, "vm"), client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
			}
			report()
			setNodeReady(p.Node, false)
			// Well past the grace, nothing moves while the reports go on.
			for range 5 * int(testNodeLostGrace/time.Second) {
				time.Sleep(500 * time.Millisecond)
				report()
				f := getFTVM(ns, "vm")
				Expect(f.Status.Primary).NotTo(BeNil())
				Expect(f.Status.Primary.VMI).To(Equal(p.VMI), "no failover while lockstepd reports the pair replicating: %s", conditionsOf(f))
				Expect(f.Status.FailoverCount).To(BeZero())
			}
			c := apimeta.FindStatusCondition(getFTVM(ns, "vm").Status.Conditions, ftv1.ConditionPrimaryReady)
			Expect(c).NotTo(BeNil())
			Expect(c.Reason).To(Equal(ftv1.ReasonNodeSilentReplicating))
			Expect(c.Message).To(ContainSubstring("lockstepd there reported " + p.VMI + " Protected"))
			// The reports stop (the host died after all): the node's verdict stands.
			after := waitFor(ns, "vm", "failed over", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.Primary != nil && f.Status.Primary.VMI == sec.VMI
			})
			Expect(after.Status.FailoverCount).To(Equal(int32(1)))
		})

		It("follows lockstepd when its secondary wins the pair's Lease: relabels, fences the old primary, counts once", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// What the secondary's lockstepd does when it goes live: compare-and-set on the record.
			lease := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, lease)).To(Succeed())
			Expect(*lease.Spec.HolderIdentity).To(Equal(ftv1.SideIdentity(oldPrimary.Node, oldPrimary.VMI)))
			identity, epoch := ftv1.SideIdentity(oldSecondary.Node, oldSecondary.VMI), *lease.Spec.LeaseTransitions+1
			lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = &identity, &epoch
			Expect(k8s.Update(ctx(), lease)).To(Succeed())

			after := waitFor(ns, "vm", "protected by a new secondary", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != oldSecondary.VMI
			})
			Expect(after.Status.Primary.VMI).To(Equal(oldSecondary.VMI))
			Expect(after.Status.FailoverCount).To(Equal(int32(1)))
			Expect(after.Status.Epoch).To(Equal(int64(epoch)))
			Eventually(isGone(ns, oldPrimary.VMI), timeout, interval).Should(BeTrue())
			Expect(eventMessages(ns, "vm", ftv1.ReasonPromoted)).To(ContainSubstring("lockstepd won the pair's Lease"))
			Expect(eventReasons(ns, "vm")).To(ContainElement(ftv1.ReasonMemberFenced))
			Consistently(func() int32 { return getFTVM(ns, "vm").Status.FailoverCount }, time.Second, interval).Should(Equal(int32(1)))
		})

		It("adopts a record that lockstepd made, as it is", func() {
			primary := got.Status.Primary
			// An operator before the record existed left the Lease to lockstepd, which makes it
			// without labels or owner, and moved it on.
			lease := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, lease)).To(Succeed())
			identity, epoch := ftv1.SideIdentity(primary.Node, primary.VMI), int32(7)
			lease.Labels, lease.OwnerReferences, lease.Annotations = nil, nil, nil
			lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = &identity, &epoch
			Expect(k8s.Update(ctx(), lease)).To(Succeed())
			before := resourceVersions(members(ns, "vm"))
			Eventually(func(g Gomega) {
				lease := &coordinationv1.Lease{}
				g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, lease)).To(Succeed())
				g.Expect(metav1.IsControlledBy(lease, getFTVM(ns, "vm"))).To(BeTrue())
				g.Expect(lease.Labels).To(HaveKeyWithValue(ftv1.LabelManagedBy, ftv1.ManagedByValue))
				g.Expect(*lease.Spec.HolderIdentity).To(Equal(identity))
				g.Expect(*lease.Spec.LeaseTransitions).To(Equal(epoch))
			}, timeout, interval).Should(Succeed())
			after := waitFor(ns, "vm", "the adopted epoch", func(f *ftv1.FaultTolerantVM) bool { return f.Status.Epoch == int64(epoch) })
			Expect(after.Status.State).To(Equal(ftv1.StateProtected))
			Expect(after.Status.Primary.VMI).To(Equal(primary.VMI))
			Expect(resourceVersions(members(ns, "vm"))).To(Equal(before), "the members are untouched")
		})

		It("fences a second member labelled primary that does not hold the record, and starts no third", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// A bug, or an older version, labels the secondary primary without the record.
			vmi, err := getVMI(ns, oldSecondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			base := vmi.DeepCopy()
			vmi.Labels[ftv1.LabelRole] = ftv1.RolePrimary
			Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())

			Eventually(isGone(ns, oldSecondary.VMI), timeout, interval).Should(BeTrue())
			after := waitFor(ns, "vm", "protected by a new secondary", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != oldSecondary.VMI
			})
			Expect(after.Status.Primary.VMI).To(Equal(oldPrimary.VMI), "the record's holder stays the primary")
			Expect(after.Status.FailoverCount).To(BeZero())
			Expect(eventMessages(ns, "vm", ftv1.ReasonMemberFenced)).To(ContainSubstring("does not hold the pair's record"))
			Expect(members(ns, "vm")).To(HaveLen(2))
		})

		It("removes everything it made when deleted mid-failover, the logging network and the record included", func() {
			withNet := newFTVM(ns, "net")
			withNet.Spec.LoggingNetwork = ftv1.LoggingNetwork{Name: "made-net", Config: `{"cniVersion":"0.3.1","type":"bridge"}`}
			Expect(k8s.Create(ctx(), withNet)).To(Succeed())
			before := waitForState(ns, "net", ftv1.StateProtected)
			// The primary's node stops answering: the failover has begun but the grace has not run out.
			setNodeUnknownSince(before.Status.Primary.Node, metav1.Now())
			Expect(k8s.Delete(ctx(), getFTVM(ns, "net"))).To(Succeed())
			Eventually(func() error {
				return k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "made-net"}, &nadv1.NetworkAttachmentDefinition{})
			}, timeout, interval).Should(Satisfy(apierrors.IsNotFound))
			Eventually(func() error {
				return k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("net")}, &coordinationv1.Lease{})
			}, timeout, interval).Should(Satisfy(apierrors.IsNotFound))
			Expect(members(ns, "net")).To(BeEmpty())
		})

		It("starts a new secondary when the secondary's node is deleted", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			Expect(k8s.Delete(ctx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: oldSecondary.Node}})).To(Succeed())
			Eventually(isGone(ns, oldSecondary.VMI), timeout, interval).Should(BeTrue())
			after := waitFor(ns, "vm", "protected by a new secondary", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != oldSecondary.VMI
			})
			Expect(after.Status.Primary.VMI).To(Equal(oldPrimary.VMI), "the primary is untouched")
			Expect(after.Status.Secondary.Node).NotTo(BeElementOf(oldPrimary.Node, oldSecondary.Node))
			Expect(after.Status.FailoverCount).To(BeZero())
			Expect(eventReasons(ns, "vm")).To(ContainElement(ftv1.ReasonSecondaryLost))
		})

		It("replaces the secondary as soon as the primary's lockstepd reports that it won the Lease against it, before any node looks lost", func() {
			p, sec := got.Status.Primary, got.Status.Secondary
			// What the primary's lockstepd writes when its secondary went silent and it won the
			// pair's Lease: it runs the VM alone. Every node still looks Ready.
			// The API keeps seconds: the report comes in a later second than the secondary's creation.
			v, err := getVMI(ns, sec.VMI)
			Expect(err).NotTo(HaveOccurred())
			time.Sleep(time.Until(v.CreationTimestamp.Add(time.Second)))
			alone := time.Now().UTC().Format(time.RFC3339)
			patch := fmt.Sprintf(`{"status":{"replication":{"primary":{"vmi":%q,"node":%q,"state":"Alone","since":%q,"epoch":%d,"reportTime":%q}}}}`,
				p.VMI, p.Node, alone, got.Status.Epoch+1, alone)
			Expect(k8s.Status().Patch(ctx(), getFTVM(ns, "vm"), client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
			Eventually(isGone(ns, sec.VMI), timeout, interval).Should(BeTrue())
			after := waitFor(ns, "vm", "a new secondary", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.Secondary != nil && f.Status.Secondary.VMI != sec.VMI
			})
			Expect(after.Status.Primary.VMI).To(Equal(p.VMI), "the primary is untouched")
			Expect(after.Status.FailoverCount).To(BeZero())
			Expect(after.Status.Secondary.Node).NotTo(Equal(sec.Node), "the node where the pair just lost a member is avoided")
			Expect(eventMessages(ns, "vm", ftv1.ReasonSecondaryLost)).To(ContainSubstring("won the Lease against its silent secondary"))
		})

		It("treats KubeVirt's PodNotExists as the loss of the member", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			vmi, err := getVMI(ns, oldPrimary.VMI)
			Expect(err).NotTo(HaveOccurred())
			base := vmi.DeepCopy()
			vmi.Status.Conditions = []virtv1.VirtualMachineInstanceCondition{{Type: virtv1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: virtv1.PodNotExistsReason}}
			Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
			waitFor(ns, "vm", "the secondary promoted and a new one protecting it", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Primary.VMI == oldSecondary.VMI
			})
		})

		It("never promotes a secondary that started while its primary's node was failing: the VM restarts instead", func() {
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			Expect(getVMIAnnotation(ns, oldSecondary.VMI, ftv1.AnnotationSyncedAt)).NotTo(BeEmpty(), "a Protected pair's secondary is synchronized")
			makeNode("node-4", "zone-a") // two nodes stay healthy, for the restarted pair
			// The primary's node stops reporting (suspect, within the grace), and the secondary's
			// node is lost at once: a new secondary starts beside a primary that cannot feed it.
			setNodeUnknownSince(oldPrimary.Node, metav1.Now())
			setNodeReady(oldSecondary.Node, false)
			waitFor(ns, "vm", "a new secondary, not synchronized", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.Secondary != nil && f.Status.Secondary.VMI == "vm-3" && f.Status.State != ftv1.StateProtected
			})
			Expect(getVMIAnnotation(ns, "vm-3", ftv1.AnnotationSyncedAt)).To(BeEmpty())

			after := waitFor(ns, "vm", "restarted and protected", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Primary.VMI != oldPrimary.VMI && f.Status.Primary.VMI != "vm-3"
			})
			Expect(after.Status.FailoverCount).To(BeZero(), "a restart from disk is not a failover")
			Expect(eventMessages(ns, "vm", ftv1.ReasonPrimaryLost)).To(ContainSubstring("secondary vm-3 never synchronized"))
		})

		It("restarts a primary that runs alone, cut from the API server, only once its record's term passed since its last renewal", func() {
			oldPrimary := got.Status.Primary
			setProtection(ns, "vm", ftv1.ProtectionSuspended)
			Eventually(func() []virtv1.VirtualMachineInstance { return members(ns, "vm") }, timeout, interval).Should(HaveLen(1))
			// The primary's lockstepd renews the record, as it does every fifth of the term.
			const recordTerm = 6 * time.Second
			lease := &coordinationv1.Lease{}
			key := types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}
			Expect(k8s.Get(ctx(), key, lease)).To(Succeed())
			arb := &arbiter.Arbiter{Client: k8s, Lease: key, Identity: *lease.Spec.HolderIdentity, Term: term.Term(recordTerm)}
			Expect(arb.Renew(ctx(), uint64(*lease.Spec.LeaseTransitions), oldPrimary.VMI)).To(Succeed())
			renewed := time.Now()
			// Its node is cut from the API server: no heartbeat, no renewal.
			setNodeReady(oldPrimary.Node, false)
			waitFor(ns, "vm", "waiting for the record's term", func(f *ftv1.FaultTolerantVM) bool {
				c := condition(f, ftv1.ConditionProtected)
				return c != nil && c.Reason == ftv1.ReasonWaitingForRecordTerm
			})
			Expect(condition(getFTVM(ns, "vm"), ftv1.ConditionProtected).Message).To(ContainSubstring(oldPrimary.VMI))
			vmi, err := getVMI(ns, oldPrimary.VMI)
			Expect(err).NotTo(HaveOccurred())
			Expect(vmi.DeletionTimestamp).To(BeNil(), "not fenced while its term runs")

			after := waitFor(ns, "vm", "restarted elsewhere", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.Primary != nil && f.Status.Primary.VMI != oldPrimary.VMI
			})
			Expect(after.Status.Primary.Node).NotTo(Equal(oldPrimary.Node))
			// The record left the old primary (its acquire time is the operator's write, on this
			// machine's clock) no sooner than the term after its last renewal.
			Expect(k8s.Get(ctx(), key, lease)).To(Succeed())
			Expect(lease.Spec.AcquireTime.Time).To(BeTemporally(">=", renewed.Add(recordTerm)))
		})

		It("waits for the grace period before judging a NotReady node lost", func() {
			setNodeUnknownSince(got.Status.Primary.Node, metav1.Now())
			Eventually(func() string {
				return condition(getFTVM(ns, "vm"), ftv1.ConditionPrimaryReady).Reason
			}, timeout, interval).Should(Equal("NodeNotReady"))
			Expect(getFTVM(ns, "vm").Status.FailoverCount).To(BeZero(), "not before the grace period")
			Eventually(func() int32 { return getFTVM(ns, "vm").Status.FailoverCount }, timeout, interval).Should(Equal(int32(1)))
		})
	})

	Context("where lockstepd runs", func() {
		// lockstepd publishes its logging address on its Node when it starts: from then on it is
		// the one writer of a secondary's synchronization.
		BeforeEach(func() {
			for i := 1; i <= 3; i++ {
				name := makeNode(fmt.Sprintf("node-%d", i), "zone-a")
				node := &corev1.Node{}
				Expect(k8s.Get(ctx(), types.NamespacedName{Name: name}, node)).To(Succeed())
				base := node.DeepCopy()
				node.Annotations = map[string]string{ftv1.AnnotationNodeLoggingAddress: fmt.Sprintf("10.9.0.%d:7410", i)}
				Expect(k8s.Patch(ctx(), node, client.MergeFrom(base))).To(Succeed())
			}
		})

		It("leaves the secondary's synchronization to lockstepd, and is Protected only once lockstepd marks it", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
			got := waitFor(ns, "vm", "both members running", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.Primary != nil && f.Status.Secondary != nil && f.Status.State == ftv1.StateStarting &&
					condition(f, ftv1.ConditionSecondaryReady) != nil && condition(f, ftv1.ConditionSecondaryReady).Status == metav1.ConditionTrue
			})
			Consistently(func() string { return getVMIAnnotation(ns, got.Status.Secondary.VMI, ftv1.AnnotationSyncedAt) }, "2s", interval).
				Should(BeEmpty(), "the operator does not infer what lockstepd reports")
			Expect(getFTVM(ns, "vm").Status.State).To(Equal(ftv1.StateStarting))

			// What lockstepd writes when its engine finished the initial synchronization.
			vmi, err := getVMI(ns, got.Status.Secondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			base := vmi.DeepCopy()
			vmi.Annotations[ftv1.AnnotationSyncedAt] = time.Now().UTC().Format(time.RFC3339)
			Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
			waitForState(ns, "vm", ftv1.StateProtected)
		})

		It("never promotes a secondary that lockstepd reports unsynchronized: the VM restarts from its disks", func() {
			Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
			got := waitFor(ns, "vm", "both members running", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.Primary != nil && f.Status.Secondary != nil && f.Status.State == ftv1.StateStarting
			})
			oldPrimary, oldSecondary := got.Status.Primary, got.Status.Secondary
			// The secondary was synchronized once, but its lockstepd now says it holds nothing
			// (it restarted, and the protection ended with it).
			patch := fmt.Sprintf(`{"status":{"replication":{"secondary":{"vmi":%q,"node":%q,"state":"Replicating","synchronized":false,"reportTime":%q}}}}`,
				oldSecondary.VMI, oldSecondary.Node, time.Now().UTC().Format(time.RFC3339))
			Expect(k8s.Status().Patch(ctx(), getFTVM(ns, "vm"), client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
			vmi, err := getVMI(ns, oldSecondary.VMI)
			Expect(err).NotTo(HaveOccurred())
			base := vmi.DeepCopy()
			vmi.Annotations[ftv1.AnnotationSyncedAt] = time.Now().UTC().Format(time.RFC3339)
			Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
			Consistently(func() ftv1.FTState { return getFTVM(ns, "vm").Status.State }, "1s", interval).
				Should(Equal(ftv1.StateStarting), "a secondary lockstepd reports unsynchronized does not protect the VM")

			setNodeReady(oldPrimary.Node, false)
			Eventually(func() string {
				return eventMessages(ns, "vm", ftv1.ReasonPrimaryLost)
			}, timeout, interval).Should(ContainSubstring("lockstepd reports secondary " + oldSecondary.VMI + " unsynchronized"))
			after := getFTVM(ns, "vm")
			Expect(after.Status.FailoverCount).To(BeZero(), "the unsynchronized secondary was not promoted")
			if v, err := getVMI(ns, oldSecondary.VMI); err == nil {
				Expect(v.Labels[ftv1.LabelRole]).NotTo(Equal(ftv1.RolePrimary))
			}
		})
	})

	Context("when the cluster is full", func() {
		It("never exceeds the FT limit, reports NotProtected with the reason, and protects when a node is added", func() {
			recorder := recordMembersPerNode()
			defer recorder.stop()
			for i := 1; i <= 4; i++ {
				makeNode(fmt.Sprintf("node-%d", i), "zone-a")
			}
			// 12 pairs need 24 members; 4 nodes take 16 (limit 4 each).
			const pairs = 12
			var wg sync.WaitGroup
			for i := range pairs {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					Expect(k8s.Create(ctx(), newFTVM(ns, fmt.Sprintf("vm-%02d", i)))).To(Succeed())
				}()
			}
			wg.Wait()

			Eventually(func() int { return countMembers(ns) }, timeout, interval).Should(Equal(16), allMembersByNode)
			// Every pair that is not protected waits for a node and says so: without a member
			// (Starting) or without a secondary (NotProtected).
			var waiting []string
			Eventually(func(g Gomega) {
				waiting = nil
				placed := 0
				for i := range pairs {
					f := getFTVM(ns, fmt.Sprintf("vm-%02d", i))
					if f.Status.State == ftv1.StateProtected {
						placed += 2
						continue
					}
					g.Expect(f.Status.State).To(BeElementOf(ftv1.StateStarting, ftv1.StateNotProtected))
					c := condition(f, ftv1.ConditionProtected)
					g.Expect(c).NotTo(BeNil())
					g.Expect(c.Reason).To(Equal(ftv1.ReasonNoEligibleNode))
					g.Expect(c.Message).To(MatchRegexp(`[34] FT VM limit reached`))
					if f.Status.Primary != nil {
						placed++
					}
					waiting = append(waiting, f.Name)
				}
				g.Expect(placed).To(Equal(16))
				g.Expect(waiting).NotTo(BeEmpty())
			}, timeout, interval).Should(Succeed())
			Expect(eventReasons(ns, waiting[0])).To(ContainElement(ftv1.ReasonNoEligibleNode))

			// Three nodes give 12 free slots for the 8 missing members. With exactly as many slots
			// as members, a pair can be left whose only free slot is on its own primary's node;
			// with a node's worth of spare slots that cannot happen (the primary's node has at
			// most 3 free, so one is elsewhere).
			By("adding three nodes, the waiting pairs get their members")
			makeNode("node-5", "zone-b")
			makeNode("node-6", "zone-b")
			makeNode("node-7", "zone-b")
			for i := range pairs {
				waitForState(ns, fmt.Sprintf("vm-%02d", i), ftv1.StateProtected)
			}
			Expect(countMembers(ns)).To(Equal(2 * pairs))
			Expect(recorder.max()).To(BeNumerically("<=", testLimits.MaxMembers), "members per node, at any moment: %v", recorder.peaks())
			Expect(recorder.sharedNode()).To(BeEmpty(), "pairs with both members on one node")
		})

		It("honours a node's own FT limit", func() {
			makeNode("small", "zone-a")
			makeNode("big", "zone-a")
			node := &corev1.Node{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Name: nodeName("small")}, node)).To(Succeed())
			base := node.DeepCopy()
			node.Annotations = map[string]string{ftv1.AnnotationNodeMaxVMs: "1"}
			Expect(k8s.Patch(ctx(), node, client.MergeFrom(base))).To(Succeed())
			for i := range 2 {
				Expect(k8s.Create(ctx(), newFTVM(ns, fmt.Sprintf("vm-%d", i)))).To(Succeed())
			}
			// Two pairs need four members; big and small (limit 1) hold three. Which pair is
			// protected depends on the order of the reconciles.
			Eventually(func() int { return countMembers(ns) }, timeout, interval).Should(Equal(3))
			Eventually(func() []ftv1.FTState {
				return []ftv1.FTState{getFTVM(ns, "vm-0").Status.State, getFTVM(ns, "vm-1").Status.State}
			}, timeout, interval).Should(ContainElement(ftv1.StateProtected))
			Consistently(func() int { return membersOnNode(nodeName("small")) }, 2*time.Second, interval).Should(Equal(1))

			By("deleting the protected VM, its slot goes to the waiting one")
			protected, waiting := "vm-0", "vm-1"
			if getFTVM(ns, "vm-1").Status.State == ftv1.StateProtected {
				protected, waiting = waiting, protected
			}
			Expect(condition(getFTVM(ns, waiting), ftv1.ConditionProtected).Reason).To(Equal(ftv1.ReasonNoEligibleNode))
			// While it waits, its record stands still: no name is handed out for a member no node
			// can hold (each write would also set off another reconcile, and another write).
			record := func() string {
				l := &coordinationv1.Lease{}
				Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName(waiting)}, l)).To(Succeed())
				return l.ResourceVersion + " last-ordinal=" + l.Annotations[ftv1.AnnotationLastOrdinal]
			}
			waitingRecord := record()
			Expect(waitingRecord).To(HaveSuffix("last-ordinal=2"), "the names of the pair, handed out with its primary")
			Consistently(record, 3*time.Second, interval).Should(Equal(waitingRecord))
			Expect(k8s.Delete(ctx(), getFTVM(ns, protected))).To(Succeed())
			waitForState(ns, waiting, ftv1.StateProtected)
			Expect(membersOnNode(nodeName("small"))).To(Equal(1))
		})
		It("counts what other pods request of a node's allocatable CPU and memory, and says so", func() {
			// A pod that is no member's asks for nearly all of busy's 16 CPUs. It is bound before
			// busy exists, so the operator has counted it long before busy could take a member.
			busy := nodeName("busy")
			hog := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hog"},
				Spec: corev1.PodSpec{NodeName: busy, Containers: []corev1.Container{{Name: "hog", Image: "hog",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("15500m")}}}}},
			}
			Expect(k8s.Create(ctx(), hog)).To(Succeed())
			makeNode("free", "zone-a")
			Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
			waitForState(ns, "vm", ftv1.StateNotProtected)

			By("a node whose other pods leave less than a member asks for takes none")
			makeNode("busy", "zone-a")
			waiting := waitingForRoom(ns, "vm", placement.RejectInsufficientCPU)
			Eventually(waiting, timeout, interval).Should(Succeed())
			Consistently(waiting, 3*time.Second, interval).Should(Succeed())
			Expect(membersOnNode(busy)).To(Equal(0))

			By("once the pod is gone, the secondary goes there")
			Expect(k8s.Delete(ctx(), hog, client.GracePeriodSeconds(0))).To(Succeed())
			waitForState(ns, "vm", ftv1.StateProtected)
			Expect(membersOnNode(busy)).To(Equal(1))
		})
		It("sizes a member as the cluster's KubeVirt CR has virt-controller size its launcher", func() {
			// KubeVirt's overhead ratio of 4 makes a secondary's launcher over a GiB larger: a
			// node with room for the secondary KubeVirt's defaults size, and not for this one.
			ratio := "4"
			kv := &virtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubevirt"}}
			kv.Spec.Configuration.AdditionalGuestMemoryOverheadRatio = &ratio
			Expect(k8s.Create(ctx(), kv)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx(), kv))).To(Succeed()) })
			tmpl := newFTVM(ns, "vm").Spec.Template
			_, byDefault, err := member.LauncherRequests(tmpl, ftv1.RoleSecondary, member.Options{PriorityClassName: "lockstep-ft"}, kubevirtsize.ClusterOf(nil, runtime.GOARCH))
			Expect(err).NotTo(HaveOccurred())
			_, byRatio, err := member.LauncherRequests(tmpl, ftv1.RoleSecondary, member.Options{PriorityClassName: "lockstep-ft"}, kubevirtsize.ClusterOf(kv, runtime.GOARCH))
			Expect(err).NotTo(HaveOccurred())
			Expect(byRatio - byDefault).To(BeNumerically(">", 512<<20))

			makeNode("free", "zone-a")
			Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
			waitForState(ns, "vm", ftv1.StateNotProtected)
			tight := nodeName("tight")
			makeNode("tight", "zone-a")
			setAllocatable(tight, "16", fmt.Sprint((byDefault+byRatio)/2))

			By("the node has room for the secondary at KubeVirt's default size only: it takes none")
			waiting := waitingForRoom(ns, "vm", placement.RejectInsufficientMemory)
			Eventually(waiting, timeout, interval).Should(Succeed())
			Consistently(waiting, 3*time.Second, interval).Should(Succeed())
			Expect(membersOnNode(tight)).To(Equal(0))

			By("without the ratio, the secondary fits there")
			Expect(k8s.Delete(ctx(), kv)).To(Succeed())
			setAllocatable(tight, "16", fmt.Sprint((byDefault+byRatio)/2+1)) // a node event: the next decision
			waitForState(ns, "vm", ftv1.StateProtected)
			Expect(membersOnNode(tight)).To(Equal(1))
		})
	})

	Context("across an operator restart", func() {
		It("changes nothing", func() {
			for i := 1; i <= 3; i++ {
				makeNode(fmt.Sprintf("node-%d", i), "zone-a")
			}
			for i := range 3 {
				Expect(k8s.Create(ctx(), newFTVM(ns, fmt.Sprintf("vm-%d", i)))).To(Succeed())
			}
			for i := range 3 {
				waitForState(ns, fmt.Sprintf("vm-%d", i), ftv1.StateProtected)
			}
			var before virtv1.VirtualMachineInstanceList
			Expect(k8s.List(ctx(), &before, client.InNamespace(ns))).To(Succeed())
			statusBefore := map[string]ftv1.FaultTolerantVMStatus{}
			for i := range 3 {
				f := getFTVM(ns, fmt.Sprintf("vm-%d", i))
				statusBefore[f.Name] = f.Status
			}

			operator.stop()
			reconciles := reconcileCount()
			operator = startOperator()
			// The new manager reconciles every FaultTolerantVM once it has synced.
			Eventually(reconcileCount, timeout, interval).Should(BeNumerically(">=", reconciles+3))
			Consistently(func(g Gomega) {
				var after virtv1.VirtualMachineInstanceList
				g.Expect(k8s.List(ctx(), &after, client.InNamespace(ns))).To(Succeed())
				g.Expect(resourceVersions(after.Items)).To(Equal(resourceVersions(before.Items)))
				for name, st := range statusBefore {
					g.Expect(getFTVM(ns, name).Status).To(Equal(st))
				}
			}, 3*time.Second, 200*time.Millisecond).Should(Succeed())
		})
	})
})

func patchRunStrategy(ns, name string, rs ftv1.RunStrategy) {
	ftvm := getFTVM(ns, name)
	base := ftvm.DeepCopy()
	ftvm.Spec.RunStrategy = rs
	Expect(k8s.Patch(ctx(), ftvm, client.MergeFrom(base))).To(Succeed())
}

func resourceVersions(vmis []virtv1.VirtualMachineInstance) map[string]string {
	out := map[string]string{}
	for _, v := range vmis {
		out[v.Name] = v.ResourceVersion
	}
	return out
}

func countMembers(ns string) int {
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx(), &vmis, client.InNamespace(ns))).To(Succeed())
	return len(vmis.Items)
}

// allMembersByNode describes every member VMI in the cluster, for failure messages.
func allMembersByNode() string {
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx(), &vmis)).To(Succeed())
	out := map[string][]string{}
	for _, v := range vmis.Items {
		out[v.Labels[ftv1.LabelNode]] = append(out[v.Labels[ftv1.LabelNode]], fmt.Sprintf("%s/%s(deleting=%v)", v.Namespace, v.Name, v.DeletionTimestamp != nil))
	}
	return fmt.Sprintf("members by node: %v", out)
}

func membersOnNode(node string) int {
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx(), &vmis, client.MatchingLabels{ftv1.LabelNode: node})).To(Succeed())
	return len(vmis.Items)
}

// getTable asks the API server for the FaultTolerantVM as kubectl does, as a Table, so that the
// printer columns are checked as a user sees them.
func getTable(ns, name string) *metav1.Table {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &ftv1.GroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(controllers.NewScheme()).WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	Expect(err).NotTo(HaveOccurred())
	raw, err := rc.Get().Namespace(ns).Resource("faulttolerantvms").Name(name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx()).Raw()
	Expect(err).NotTo(HaveOccurred())
	table := &metav1.Table{}
	Expect(json.Unmarshal(raw, table)).To(Succeed())
	return table
}

func failoverMetric(ns, name string) float64 {
	return gauge("lockstep_ftvm_failovers_total", map[string]string{"namespace": ns, "name": name})
}

func reconcileCount() float64 {
	return gauge("controller_runtime_reconcile_total", map[string]string{"controller": "faulttolerantvm", "result": "success"}) +
		gauge("controller_runtime_reconcile_total", map[string]string{"controller": "faulttolerantvm", "result": "requeue_after"})
}

// gauge reads a metric's value from controller-runtime's registry.
func gauge(name string, labels map[string]string) float64 {
	families, err := crmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				if labelValue(m, k) != v {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// membersPerNode watches member VMIs and records, at every moment, how many each node holds and
// whether a pair ever had both members on one node.
type membersPerNode struct {
	mu     sync.Mutex
	cur    map[string]map[string]bool // node -> VMI keys
	peak   map[string]int
	shared map[string]bool // pair keys that shared a node
	pairOf map[string]string
	w      watch.Interface
	done   chan struct{}
}

func recordMembersPerNode() *membersPerNode {
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: controllers.NewScheme()})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(ctx(), &virtv1.VirtualMachineInstanceList{})
	Expect(err).NotTo(HaveOccurred())
	r := &membersPerNode{cur: map[string]map[string]bool{}, peak: map[string]int{}, shared: map[string]bool{}, pairOf: map[string]string{}, w: w, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ev := range w.ResultChan() {
			vmi, ok := ev.Object.(*virtv1.VirtualMachineInstance)
			if !ok {
				continue
			}
			node, key := vmi.Labels[ftv1.LabelNode], vmi.Namespace+"/"+vmi.Name
			r.mu.Lock()
			if r.cur[node] == nil {
				r.cur[node] = map[string]bool{}
			}
			if ev.Type == watch.Deleted {
				delete(r.cur[node], key)
			} else {
				r.cur[node][key] = true
				pair := vmi.Namespace + "/" + vmi.Labels[ftv1.LabelPair]
				r.pairOf[key] = pair
				for other := range r.cur[node] {
					if other != key && r.pairOf[other] == pair {
						r.shared[pair] = true
					}
				}
			}
			r.peak[node] = max(r.peak[node], len(r.cur[node]))
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *membersPerNode) stop() { r.w.Stop(); <-r.done }

func (r *membersPerNode) max() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := 0
	for _, p := range r.peak {
		m = max(m, p)
	}
	return m
}

func (r *membersPerNode) peaks() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.peak {
		out[k] = v
	}
	return out
}

func (r *membersPerNode) sharedNode() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for p := range r.shared {
		out = append(out, p)
	}
	return out
}

// waitingForRoom checks that a FaultTolerantVM runs NotProtected because one node rejects its
// secondary for reject (a placement.Reject* reason).
func waitingForRoom(ns, name, reject string) func(Gomega) {
	return func(g Gomega) {
		f := getFTVM(ns, name)
		g.Expect(f.Status.State).To(Equal(ftv1.StateNotProtected))
		c := condition(f, ftv1.ConditionProtected)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(ftv1.ReasonNoEligibleNode))
		g.Expect(c.Message).To(ContainSubstring("1 " + reject))
	}
}
