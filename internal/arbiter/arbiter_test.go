package arbiter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lockstep-dev/lockstep/internal/term"
)

// The Lease lives in a real kube-apiserver (envtest): its compare-and-set is the API server's.
var cfg *rest.Config

func TestMain(m *testing.M) {
	env := &envtest.Environment{BinaryAssetsDirectory: filepath.Join("..", "..", "bin", "k8s")}
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		env.BinaryAssetsDirectory = ""
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start envtest (make envtest-assets builds kube-apiserver and etcd):", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

func newArbiter(t *testing.T, lease, identity string) *Arbiter {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &Arbiter{Client: c, Lease: types.NamespacedName{Namespace: "default", Name: lease}, Identity: identity, Timeout: 5 * time.Second}
}

// TestExactlyOneSideWinsEachRace has both sides of a pair claim the Lease at once, round after
// round, as when each stops hearing the other: exactly one wins each round, with the next epoch.
func TestExactlyOneSideWinsEachRace(t *testing.T) {
	ctx := context.Background()
	p, s := newArbiter(t, "race", "node-1/db-1"), newArbiter(t, "race", "node-2/db-2")
	h, err := p.Ensure(ctx)
	if err != nil || h.Epoch != 1 || h.Identity != "node-1/db-1" || !h.Self {
		t.Fatalf("ensure: %+v %v", h, err)
	}
	if h2, err := s.Ensure(ctx); err != nil || h2.Identity != h.Identity || h2.Epoch != h.Epoch || h2.Self {
		t.Fatalf("a second Ensure must not change the holder: %+v %v", h2, err)
	}
	// The operator writes its annotations on the record all the while (as it does when it starts
	// a new secondary): a write that moves no epoch must not make both sides lose.
	stop := make(chan struct{})
	defer close(stop)
	go writeAnnotations(t, "race", stop)
	epoch := h.Epoch
	wins := map[string]int{}
	for round := range 40 {
		var wg sync.WaitGroup
		results := make([]error, 2)
		epochs := make([]uint64, 2)
		for i, a := range []*Arbiter{p, s} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				epochs[i], results[i] = a.Claim(ctx, epoch)
			}()
		}
		wg.Wait()
		won := 0
		for i, a := range []*Arbiter{p, s} {
			switch {
			case results[i] == nil:
				won++
				wins[a.Identity]++
				if epochs[i] != epoch+1 {
					t.Fatalf("round %d: %s won epoch %d, want %d", round, a.Identity, epochs[i], epoch+1)
				}
			case !errors.Is(results[i], ErrLost):
				t.Fatalf("round %d: %s: %v", round, a.Identity, results[i])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d sides won (%v)", round, won, results)
		}
		epoch++
		if cur, err := p.Current(ctx); err != nil || cur.Epoch != epoch {
			t.Fatalf("round %d: lease at %+v, %v", round, cur, err)
		}
	}
	t.Logf("wins over 40 races: %v", wins)
}

// writeAnnotations updates an annotation of Lease name until stop, as the operator does.
func writeAnnotations(t *testing.T, name string, stop <-chan struct{}) {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Error(err)
		return
	}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		_ = setAnnotation(c, name, strconv.Itoa(n))
	}
}

func setAnnotation(c client.Client, name, value string) error {
	l := &coordinationv1.Lease{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, l); err != nil {
		return err
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations["ft.lockstep.dev/last-ordinal"] = value
	return c.Update(context.Background(), l)
}

// TestAWriteBetweenReadAndClaimIsNoLoss: a write that lands between the claim's read and its
// update fails the update with a conflict. When the write moved no epoch (the operator's
// annotations), the claim still wins; when it was the other side's claim, it has lost.
func TestAWriteBetweenReadAndClaimIsNoLoss(t *testing.T) {
	ctx := context.Background()
	p, s := newArbiter(t, "between", "node-1/db-1"), newArbiter(t, "between", "node-2/db-2")
	if _, err := p.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	plain := p.Client
	watching, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Each claim's first read is followed by the write under test.
	between := func(write func() error) *Arbiter {
		first := true
		c := interceptor.NewClient(watching, interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				err := c.Get(ctx, key, obj, opts...)
				if err == nil && first {
					first = false
					if werr := write(); werr != nil {
						t.Fatalf("the write between: %v", werr)
					}
				}
				return err
			},
		})
		a := *s
		a.Client = c
		return &a
	}

	a := between(func() error { return setAnnotation(plain, "between", "7") })
	if e, err := a.Claim(ctx, 1); err != nil || e != 2 {
		t.Fatalf("a claim across the operator's annotation write: %d %v, want epoch 2", e, err)
	}
	if cur, err := p.Current(ctx); err != nil || cur.Identity != "node-2/db-2" || cur.Epoch != 2 {
		t.Fatalf("lease at %+v %v", cur, err)
	}

	a = between(func() error { _, err := p.Claim(ctx, 2); return err })
	if _, err := a.Claim(ctx, 2); !errors.Is(err, ErrLost) {
		t.Fatalf("a claim across the other side's claim must be lost: %v", err)
	}
	if cur, err := p.Current(ctx); err != nil || cur.Identity != "node-1/db-1" || cur.Epoch != 3 {
		t.Fatalf("lease at %+v %v", cur, err)
	}
}

func TestAStaleSideLoses(t *testing.T) {
	ctx := context.Background()
	p, s := newArbiter(t, "stale", "node-1/db-1"), newArbiter(t, "stale", "node-2/db-2")
	if _, err := p.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Claim(ctx, 1); err != nil || e != 2 {
		t.Fatalf("secondary's claim: %d %v", e, err)
	}
	// The old primary comes back believing epoch 1: it has lost, and must fence itself.
	if _, err := p.Claim(ctx, 1); !errors.Is(err, ErrLost) {
		t.Fatalf("stale claim: %v", err)
	}
	// A retry of a claim that went through is a win, not a loss.
	if e, err := s.Claim(ctx, 1); err != nil || e != 2 {
		t.Fatalf("retried claim: %d %v", e, err)
	}
}

func TestNoArbiterNoWinner(t *testing.T) {
	dead := rest.CopyConfig(cfg)
	dead.Host = "https://127.0.0.1:1" // nothing listens there
	c, err := client.New(dead, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	a := &Arbiter{Client: c, Lease: types.NamespacedName{Namespace: "default", Name: "x"}, Identity: "me", Timeout: time.Second}
	if _, err := a.Claim(context.Background(), 1); err == nil || errors.Is(err, ErrLost) {
		t.Fatalf("with the API server unreachable a claim must fail, not win or lose: %v", err)
	}
}

// TestHolderNamedBeforeItsNodeIsSelf: the operator names a new primary in the record before the
// scheduler gave it a node ("/<vmi>"); that member's lockstepd must recognize the record as its
// own, and another member's must not.
func TestHolderNamedBeforeItsNodeIsSelf(t *testing.T) {
	ctx := context.Background()
	op := newArbiter(t, "named-early", "/db-1")
	if h, err := op.Ensure(ctx); err != nil || h.Identity != "/db-1" {
		t.Fatalf("ensure: %+v %v", h, err)
	}
	if h, err := newArbiter(t, "named-early", "node-1/db-1").Ensure(ctx); err != nil || !h.Self {
		t.Fatalf("the named member: %+v %v, want Self", h, err)
	}
	if h, err := newArbiter(t, "named-early", "node-2/db-2").Ensure(ctx); err != nil || h.Self {
		t.Fatalf("another member: %+v %v, want not Self", h, err)
	}
}

// TestRenewalsKeepTheHolderAndAClaimEndsThem: the holder's renewals stamp the record's term and
// renew time and move nothing else, while the operator writes its annotations and the secondary
// renews nothing of its own; once the secondary claims the record, the old holder's renewal at
// its epoch is lost (it must fence itself) and the new holder's goes through.
func TestRenewalsKeepTheHolderAndAClaimEndsThem(t *testing.T) {
	ctx := context.Background()
	p, s := newArbiter(t, "renew", "node-1/db-1"), newArbiter(t, "renew", "node-2/db-2")
	p.Term, s.Term = term.Term(12*time.Second), term.Term(12*time.Second)
	if _, err := p.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go writeAnnotations(t, "renew", stop)
	var last time.Time
	for range 20 {
		if err := p.Renew(ctx, 1, "db-1"); err != nil {
			close(stop)
			t.Fatalf("the holder's renewal: %v", err)
		}
		lease := &coordinationv1.Lease{}
		if err := p.Client.Get(ctx, p.Lease, lease); err != nil {
			t.Fatal(err)
		}
		if *lease.Spec.HolderIdentity != "node-1/db-1" || *lease.Spec.LeaseTransitions != 1 ||
			lease.Spec.LeaseDurationSeconds == nil || *lease.Spec.LeaseDurationSeconds != 12 || lease.Annotations["ft.lockstep.dev/renewed-by"] != "node-1/db-1" {
			close(stop)
			t.Fatalf("after a renewal: %+v %v", lease.Spec, lease.Annotations)
		}
		if lease.Spec.RenewTime.Time.Before(last) {
			close(stop)
			t.Fatalf("the renew time went back: %s after %s", lease.Spec.RenewTime.Time, last)
		}
		last = lease.Spec.RenewTime.Time
	}
	close(stop)
	if err := s.Renew(ctx, 1, "db-2"); !errors.Is(err, ErrLost) {
		t.Fatalf("a renewal for a member the record does not name: %v, want ErrLost", err)
	}
	if _, err := s.Claim(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Renew(ctx, 1, "db-1"); !errors.Is(err, ErrLost) {
		t.Fatalf("the old holder's renewal after the claim: %v, want ErrLost", err)
	}
	if err := s.Renew(ctx, 2, "db-2"); err != nil {
		t.Fatalf("the new holder's renewal: %v", err)
	}
}

// TestAClaimUnderASlowAPIServerIsDecidedWithinItsAttempt: an API server that takes 1.2 s to
// answer each request decides a claim whose attempt may take half lockstepd's default claim
// timeout (lockstepd.Config.ClaimAttemptTimeout); an attempt bounded to one second, as lockstepd
// had it, never reaches a decision, and the winner would have fenced itself.
func TestAClaimUnderASlowAPIServerIsDecidedWithinItsAttempt(t *testing.T) {
	ctx := context.Background()
	p := newArbiter(t, "slow", "node-1/db-1")
	if _, err := p.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	inner, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	slow := interceptor.NewClient(inner, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			select {
			case <-time.After(600 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			select {
			case <-time.After(600 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	s := newArbiter(t, "slow", "node-2/db-2")
	s.Client, s.Timeout = slow, time.Second
	if _, err := s.Claim(ctx, 1); err == nil || errors.Is(err, ErrLost) {
		t.Fatalf("a one-second attempt against a 1.2 s API server: %v, want it undecided", err)
	}
	s.Timeout = 5 * time.Second / 2 // lockstepd's default claim timeout, halved
	if e, err := s.Claim(ctx, 1); err != nil || e != 2 {
		t.Fatalf("a claim within its attempt: %d %v, want epoch 2", e, err)
	}
}

func TestAHolderNamesThisSideOnlyOnItsNode(t *testing.T) {
	for _, c := range []struct {
		holder, self string
		want         bool
	}{
		{"node-1/db-1", "node-1/db-1", true},
		{"/db-1", "node-1/db-1", true},        // named before its node was known
		{"node-2/db-1", "node-1/db-1", false}, // another node wrote this member into the record
		{"node-1/db-2", "node-1/db-1", false},
		{"", "node-1/db-1", false},
	} {
		if got := names(c.holder, c.self); got != c.want {
			t.Errorf("holder %q names %q: %v, want %v", c.holder, c.self, got, c.want)
		}
	}
}
