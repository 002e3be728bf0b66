package lockstepd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// A lockstepd restart ends the protection of every VM with a member on its node (the pairs'
// streams go through it: docs/colo.md, "lockstepd restarts"). So that a rollout of lockstepd's
// DaemonSet does not walk every VM through that, one node after another, a lockstepd that stops
// leaves its successor on the node a ledger of the pairs it kept protected, and the successor is
// not ready until each of them is protected again, wherever its members now run: the DaemonSet
// (maxUnavailable 1) moves on to the next node only then.

// ledgerFile is the ledger, in --run-dir (a host directory that outlives lockstepd's pods).
const ledgerFile = "reprotection-ledger.json"

// awaitedPair is a pair that a lockstepd on this node kept protected, with Secondary, until it
// stopped at Since. A restart always ends that protection: the secondary is fenced, and the pair
// is protected again only by a new one (docs/colo.md, "lockstepd restarts").
type awaitedPair struct {
	Pair      string    `json:"pair"` // namespace/name of the FaultTolerantVM
	Secondary string    `json:"secondary,omitempty"`
	Since     time.Time `json:"since"`
}

// ProtectedPair is a pair whose member on this node is in a protected pair as lockstepd stops,
// and its secondary (this member, or its peer).
type ProtectedPair struct{ Pair, Secondary string }

// reprotectionGate is lockstepd's readiness after a restart: it reads the ledger its predecessor
// left, asks the API for each pair's Protected condition until every one is protected again (or
// Timeout passed), and writes the ledger for its own successor when lockstepd stops.
type reprotectionGate struct {
	RunDir string
	// Reader reads the FaultTolerantVMs past the cache (lockstepd caches none).
	Reader client.Reader
	// Timeout ends the wait (0: never): readiness then passes with pairs still unprotected.
	Timeout time.Duration
	Every   time.Duration

	mu      sync.Mutex
	awaited []awaitedPair
	why     map[string]string // pair -> why it is still awaited
	begun   time.Time
	// handedOver: lockstepd stops, and the ledger is its successor's (look writes it no more).
	handedOver bool
}

// load reads the ledger a stopped lockstepd left (none: nothing is awaited).
func (g *reprotectionGate) load(now time.Time) error {
	b, err := os.ReadFile(filepath.Join(g.RunDir, ledgerFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var awaited []awaitedPair
	if err := json.Unmarshal(b, &awaited); err != nil {
		return fmt.Errorf("%s: %w", ledgerFile, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// The wait began when the first of those lockstepds stopped, not when this one started: a
	// lockstepd that restarts (a crash loop, a node's reboot) must not start the timeout again,
	// or the rollout would wait for ever. (Since is this node's clock, as now is.)
	g.awaited, g.begun, g.why = awaited, now, map[string]string{}
	for _, a := range awaited {
		g.why[a.Pair] = "not looked at yet"
		if !a.Since.IsZero() && a.Since.Before(g.begun) {
			g.begun = a.Since
		}
	}
	return nil
}

// Start asks after the awaited pairs every g.Every until none is left (a manager.Runnable).
func (g *reprotectionGate) Start(ctx context.Context) error {
	lg := log.FromContext(ctx).WithName("reprotection")
	if n := g.Awaited(); n > 0 {
		lg.Info("not ready until the VMs this node held when lockstepd stopped are protected again", "vms", n, "timeout", g.Timeout.String())
	}
	t := time.NewTicker(g.Every)
	defer t.Stop()
	for g.Awaited() > 0 {
		g.look(ctx, lg, time.Now())
		if g.Awaited() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	<-ctx.Done()
	return nil
}

// look reads each awaited pair's FaultTolerantVM and drops the pairs protected again.
func (g *reprotectionGate) look(ctx context.Context, lg logr.Logger, now time.Time) {
	g.mu.Lock()
	awaited := append([]awaitedPair(nil), g.awaited...)
	g.mu.Unlock()
	var left []awaitedPair
	why := map[string]string{}
	for _, a := range awaited {
		ns, name, _ := strings.Cut(a.Pair, "/")
		ftvm := &ftv1.FaultTolerantVM{}
		err := g.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ftvm)
		switch {
		case ctx.Err() != nil:
			return // lockstepd stops: what it awaits goes to its successor as it is
		case apierrors.IsNotFound(err):
			ftvm = nil
		case err != nil:
			left, why[a.Pair] = append(left, a), "reading its FaultTolerantVM: "+err.Error()
			continue
		}
		done, reason := reprotected(ftvm, a)
		if done {
			lg.Info("a VM this node held is protected again, or needs no protection", "ftvm", a.Pair, "why", reason)
			continue
		}
		left, why[a.Pair] = append(left, a), reason
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.handedOver {
		return
	}
	for _, a := range left {
		if why[a.Pair] != g.why[a.Pair] { // the log says why lockstepd is not ready
			lg.Info("waiting for a VM this node held to be protected again", "ftvm", a.Pair, "why", why[a.Pair])
		}
	}
	if len(left) > 0 && g.Timeout > 0 && now.Sub(g.begun) >= g.Timeout {
		// Those VMs are not awaited again, by this lockstepd or the next.
		lg.Info("giving up waiting for the VMs this node held to be protected again: lockstepd is ready with them unprotected",
			"after", g.Timeout.String(), "unprotected", describeAwaited(left, why))
		left = nil
	}
	g.awaited, g.why = left, why
	if err := writeLedger(g.RunDir, left); err != nil {
		lg.Error(err, "writing the reprotection ledger")
	}
}

// reprotected says whether a pair that lockstepd kept protected until it stopped needs no more
// waiting for (a nil ftvm: it is gone), and why. Protected again means Protected with a secondary
// other than the one the restart cut off; where lockstepd did not know that secondary, with a
// Protected condition that turned True after the stop.
func reprotected(ftvm *ftv1.FaultTolerantVM, a awaitedPair) (bool, string) {
	switch {
	case ftvm == nil:
		return true, "the FaultTolerantVM is gone"
	case ftvm.DeletionTimestamp != nil:
		return true, "the FaultTolerantVM is being deleted"
	case ftvm.Spec.RunStrategy == ftv1.RunStrategyHalted:
		return true, "the VM is halted"
	case ftvm.Spec.Protection != "" && ftvm.Spec.Protection != ftv1.ProtectionEnabled:
		return true, "its protection is " + string(ftvm.Spec.Protection)
	}
	c := apimeta.FindStatusCondition(ftvm.Status.Conditions, ftv1.ConditionProtected)
	sec := ""
	if ftvm.Status.Secondary != nil {
		sec = ftvm.Status.Secondary.VMI
	}
	switch {
	case c == nil:
		return false, "no Protected condition yet"
	case c.Status != metav1.ConditionTrue:
		return false, fmt.Sprintf("Protected=%s (%s): %s", c.Status, c.Reason, c.Message)
	case a.Secondary != "" && sec != a.Secondary:
		return true, "Protected, by secondary " + sec
	case a.Secondary == "" && c.LastTransitionTime.After(a.Since):
		return true, "Protected since " + c.LastTransitionTime.UTC().Format(time.RFC3339)
	}
	// The operator has not seen the protection end yet.
	return false, "its Protected condition is from before lockstepd stopped (secondary " + orNone(a.Secondary) + ")"
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Check is the readiness check.
func (g *reprotectionGate) Check(*http.Request) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.awaited) == 0 {
		return nil
	}
	return fmt.Errorf("waiting for the VMs this node held when lockstepd stopped to be protected again: %s", describeAwaited(g.awaited, g.why))
}

// Awaited is how many pairs readiness waits for (a metric).
func (g *reprotectionGate) Awaited() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.awaited)
}

// handOver writes the ledger for the next lockstepd on the node: the pairs still awaited, and
// those this lockstepd keeps protected as it stops (since now). It is the ledger's last write.
func (g *reprotectionGate) handOver(protected []ProtectedPair, now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.handedOver = true
	ledger := append([]awaitedPair(nil), g.awaited...)
	seen := map[string]bool{}
	for _, a := range ledger {
		seen[a.Pair] = true
	}
	for _, p := range protected {
		if !seen[p.Pair] {
			ledger = append(ledger, awaitedPair{Pair: p.Pair, Secondary: p.Secondary, Since: now})
			seen[p.Pair] = true
		}
	}
	return writeLedger(g.RunDir, ledger)
}

// writeLedger replaces the ledger (none when nothing is awaited) in one rename.
func writeLedger(dir string, awaited []awaitedPair) error {
	path := filepath.Join(dir, ledgerFile)
	if len(awaited) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	sort.Slice(awaited, func(i, j int) bool { return awaited[i].Pair < awaited[j].Pair })
	b, err := json.Marshal(awaited)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// describeAwaited names the pairs awaited and why, the first few.
func describeAwaited(awaited []awaitedPair, why map[string]string) string {
	const most = 5
	parts := make([]string, 0, most+1)
	for i, a := range awaited {
		if i == most {
			parts = append(parts, fmt.Sprintf("and %d more", len(awaited)-most))
			break
		}
		parts = append(parts, a.Pair+" ("+why[a.Pair]+")")
	}
	return strings.Join(parts, "; ")
}
