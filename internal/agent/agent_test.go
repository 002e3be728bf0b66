package agent_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/term"
	"github.com/lockstep-dev/lockstep/test/leasedouble"
	"github.com/lockstep-dev/lockstep/test/pki"
	"github.com/lockstep-dev/lockstep/test/vmdouble"
)

// outputs records what clients saw, and checks each output against the secondary's state when
// it left: the secondary must already hold the value.
type outputs struct {
	mu        sync.Mutex
	seen      []string
	max       map[string]uint64
	violation error
}

// emitter records name's outputs. follower returns the secondary and the first value that must
// be checked against it (0: none yet).
func (o *outputs) emitter(name string, follower func() (*vmdouble.Counter, uint64)) func([]byte) {
	return func(b []byte) {
		_, v, err := vmdouble.ParsePayload(b)
		o.mu.Lock()
		defer o.mu.Unlock()
		if err != nil {
			o.violation = err
			return
		}
		if follower != nil && o.violation == nil {
			// An output logged while the primary was protected leaves only once the secondary
			// holds it.
			if f, from := follower(); from != 0 && v >= from && f.Value() < v {
				o.violation = fmt.Errorf("%s released output %d while protected, and its secondary held %d", name, v, f.Value())
			}
		}
		if o.max == nil {
			o.max = map[string]uint64{}
		}
		o.max[name] = max(o.max[name], v)
		if len(o.seen) == 0 || o.seen[len(o.seen)-1] != name {
			o.seen = append(o.seen, name)
		}
	}
}

func (o *outputs) snapshot() (runs []string, maxes map[string]uint64, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	maxes = map[string]uint64{}
	for k, v := range o.max {
		maxes[k] = v
	}
	return append([]string(nil), o.seen...), maxes, o.violation
}

type side struct {
	agent  *agent.Agent
	engine *vmdouble.Counter
	cancel context.CancelFunc
	done   chan error
	ln     net.Listener
}

type pair struct {
	// wrap, when set for a side's name, wraps its counter engine (to add an optional interface
	// or a failure).
	wrap       map[string]func(*vmdouble.Counter) engine.Engine
	lease      *leasedouble.Lease
	outs       *outputs
	a, b       *side
	ccfg       channel.Config
	tlsA, tlsB channel.Config
	ca         *pki.CA
	// detect is the sides' detection timeout (default 120ms).
	detect time.Duration
	// term is the record's term (0: not renewed).
	term term.Term
}

func newPair(t *testing.T) *pair {
	ca := pki.New(t, "ca")
	p := &pair{lease: &leasedouble.Lease{}, outs: &outputs{}, ca: ca, detect: 120 * time.Millisecond}
	p.ccfg = channel.Config{Pair: "ns/vm", Heartbeat: 5 * time.Millisecond, Timeout: 40 * time.Millisecond}
	p.tlsA, p.tlsB = p.ccfg, p.ccfg
	return p
}

// start runs a side on node "node-<name>": a listener with its mux, an engine and the agent.
func (p *pair) start(t *testing.T, name string, primary bool, cfg channel.Config, follower func() (*vmdouble.Counter, uint64)) *side {
	cfg.TLS = p.ca.TLSConfig(t, "node-"+name) // the side's certificate names its node
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := &channel.Mux{TLS: cfg.TLS}
	ctx, cancel := context.WithCancel(context.Background())
	s := &side{cancel: cancel, done: make(chan error, 1), ln: ln}
	go func() { _ = mux.Serve(ctx, ln) }()
	s.engine = &vmdouble.Counter{Name: name, Step: 200 * time.Microsecond, Emit: p.outs.emitter(name, follower)}
	var engine engine.Engine = s.engine
	if w := p.wrap[name]; w != nil {
		engine = w(s.engine)
	}
	s.agent = agent.New(agent.Config{
		Pair: p.ccfg.Pair, Identity: name, Primary: primary, Channel: cfg,
		Detect: p.detect, ClaimTimeout: 300 * time.Millisecond, Term: p.term, Log: logr.Discard(),
	}, engine, p.lease.Side(name), mux)
	go func() { s.done <- s.agent.Run(ctx) }()
	t.Cleanup(cancel)
	return s
}

func waitState(t *testing.T, s *side, want failover.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.agent.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: state %s, want %s (%+v)", s.agent.Status().Identity, s.agent.State(), want, s.agent.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// protect starts a primary "a" and a secondary "b" and waits until a is Protected.
func (p *pair) protect(t *testing.T) {
	t.Helper()
	p.b = p.start(t, "b", false, p.tlsB, nil)
	var from atomic.Uint64
	var a atomic.Pointer[side]
	p.a = p.start(t, "a", true, p.tlsA, func() (*vmdouble.Counter, uint64) {
		if s := a.Load(); s == nil || s.agent.State() != failover.Protected {
			return nil, 0 // alone, or claiming after a fault: released without a secondary
		}
		return p.b.engine, from.Load()
	})
	a.Store(p.a)
	p.a.agent.SetPeer(context.Background(), agent.Peer{VMI: "b", Node: "node-b", Addr: p.b.ln.Addr().String()})
	p.b.agent.SetPeer(context.Background(), agent.Peer{VMI: "a", Node: "node-a"}) // as the daemon tells each member
	waitState(t, p.a, failover.Protected)
	// Values the engine logs from now on are logged while protected (the one it may be logging
	// right now is not).
	from.Store(p.a.engine.Value() + 2)
	if st := p.b.agent.Status(); !st.Synced || st.Epoch != 2 {
		t.Fatalf("secondary after the primary joined: %+v, want synced at epoch 2", st)
	}
}

func TestPrimaryReleasesOnlyAcknowledgedOutputs(t *testing.T) {
	p := newPair(t)
	p.protect(t)
	time.Sleep(300 * time.Millisecond)
	_, maxes, err := p.outs.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if maxes["a"] < 100 {
		t.Fatalf("the primary released %d outputs in 300ms, want the VM to run protected", maxes["a"])
	}
	st := p.a.agent.Status()
	if !st.Connected || st.Interval <= 0 || st.BytesLogged == 0 || st.Epoch != 2 {
		t.Fatalf("primary status %+v: want connected, a measured interval, logged bytes, epoch 2", st)
	}
}

func TestSecondaryGoesLiveWhenPrimaryDies(t *testing.T) {
	p := newPair(t)
	p.protect(t)
	time.Sleep(100 * time.Millisecond)
	p.a.cancel() // the primary's node dies: its lockstepd and VM stop at once
	_ = p.a.ln.Close()
	waitState(t, p.b, failover.Alone)
	time.Sleep(100 * time.Millisecond)
	runs, maxes, err := p.outs.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(runs) != "[a b]" {
		t.Fatalf("outputs came from %v, want a then b", runs)
	}
	st := p.b.agent.Status()
	if st.Epoch != 3 || st.Failovers != 1 || !st.RunsVM {
		t.Fatalf("secondary after going live: %+v", st)
	}
	// Nothing a client saw is lost: b runs on from at least a's last output.
	if got := p.b.engine.Value(); got <= maxes["a"] {
		t.Fatalf("b counts at %d, a had shown %d", got, maxes["a"])
	}

	// A new secondary joins the live side: protection resumes.
	c := p.start(t, "c", false, p.tlsA, nil)
	p.b.agent.SetPeer(context.Background(), agent.Peer{VMI: "c", Node: "node-c", Addr: c.ln.Addr().String()})
	waitState(t, p.b, failover.Protected)
	if !c.agent.Status().Synced {
		t.Fatal("the new secondary is not synchronized")
	}
}

func TestPartitionWithoutArbiterFencesBoth(t *testing.T) {
	p := newPair(t)
	p.protect(t)
	p.lease.SetDown(true)
	// The secondary is told to take over (as the operator would after losing the primary's
	// node): it stops following, so the primary hears nothing either; neither reaches the Lease.
	_ = p.b.ln.Close()
	p.b.agent.Promote(context.Background())
	waitState(t, p.b, failover.Fenced)
	waitState(t, p.a, failover.Fenced)
	_, maxA, _ := p.outs.snapshot()
	time.Sleep(50 * time.Millisecond)
	_, maxB, err := p.outs.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if maxB["b"] != 0 || maxB["a"] != maxA["a"] {
		t.Fatalf("outputs after both were fenced: before %v, after %v", maxA, maxB)
	}
}

// unprotecting is an engine with streams of its own: it counts Unprotect calls and reports
// stream figures.
type unprotecting struct {
	*vmdouble.Counter
	unprotects atomic.Int32
}

func (u *unprotecting) Unprotect(string) { u.unprotects.Add(1) }

func (u *unprotecting) Streams() engine.StreamStats {
	return engine.StreamStats{Bytes: 1 << 30, Interval: 2 * time.Second}
}

// protectedWithStreams is a protected pair whose primary "a" runs an unprotecting engine.
func protectedWithStreams(t *testing.T) (*pair, *unprotecting) {
	t.Helper()
	p := newPair(t)
	var eng *unprotecting
	p.wrap = map[string]func(*vmdouble.Counter) engine.Engine{"a": func(c *vmdouble.Counter) engine.Engine {
		eng = &unprotecting{Counter: c}
		return eng
	}}
	p.protect(t)
	return p, eng
}

func TestPrimaryThatWinsAgainstASilentSecondaryUnprotects(t *testing.T) {
	p, eng := protectedWithStreams(t)
	if n := eng.unprotects.Load(); n != 0 {
		t.Fatalf("Unprotect called %d times before any failure", n)
	}
	if st := p.a.agent.Status(); st.BytesLogged < 1<<30 || st.Interval != 2*time.Second {
		t.Fatalf("the primary's status does not carry the engine's stream figures: %+v", st)
	}
	p.b.cancel() // the secondary's node dies
	_ = p.b.ln.Close()
	waitState(t, p.a, failover.Alone)
	deadline := time.Now().Add(5 * time.Second)
	for eng.unprotects.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("Unprotect called %d times after the primary won, want 1", eng.unprotects.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// A protected primary told of a new secondary (the operator replaced the one it streams to, which
// may still run where its node cannot hear that) claims the pair from the old one before it
// protects into the new one: the old one, left silent, loses its claim and is fenced.
func TestAProtectedPrimaryToldOfANewSecondaryClaimsFromTheOldOneFirst(t *testing.T) {
	p, eng := protectedWithStreams(t)
	c := p.start(t, "c", false, p.tlsB, nil)
	c.agent.SetPeer(context.Background(), agent.Peer{VMI: "a", Node: "node-a"})
	p.a.agent.SetPeer(context.Background(), agent.Peer{VMI: "c", Node: "node-c", Addr: c.ln.Addr().String()})
	waitState(t, p.b, failover.Fenced)
	waitState(t, p.a, failover.Protected)
	if n := eng.unprotects.Load(); n != 1 {
		t.Fatalf("Unprotect called %d times, want once: the protection with the old secondary ends", n)
	}
	if st := c.agent.Status(); !st.Synced || st.Epoch != 3 {
		t.Fatalf("the new secondary: %+v, want synced at epoch 3 (the primary's claim from the old one)", st)
	}
	if h := p.lease.Holder(); h.Identity != "a" || h.Epoch != 3 {
		t.Fatalf("the record: %+v, want the primary at epoch 3", h)
	}
}

// dying is an engine whose VM dies when die is closed: Run returns an error.
type dying struct {
	*vmdouble.Counter
	die chan struct{}
}

func (d *dying) Run(ctx context.Context, rec engine.Recorder) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = d.Counter.Run(ctx, rec) }()
	select {
	case <-d.die:
		return errors.New("QEMU exited")
	case <-ctx.Done():
		return nil
	}
}

func TestSideWhoseVMDiesFencesItselfAndTheSecondaryTakesOver(t *testing.T) {
	p := newPair(t)
	die := make(chan struct{})
	p.wrap = map[string]func(*vmdouble.Counter) engine.Engine{"a": func(c *vmdouble.Counter) engine.Engine {
		return &dying{Counter: c, die: die}
	}}
	// The secondary would detect the silence only after a minute: it takes over within
	// waitState's ten seconds because the fenced primary resigned (ftlog.Resign).
	p.detect = time.Minute
	p.protect(t)
	close(die) // the primary's VM dies; its lockstepd lives on
	waitState(t, p.a, failover.Fenced)
	waitState(t, p.b, failover.Alone)
	if msg := p.a.agent.Status().Message; !strings.Contains(msg, "QEMU exited") {
		t.Fatalf("the fenced side's message %q does not say why", msg)
	}
}

// exiting is an engine whose VM can exit while it is a secondary (engine.Watcher).
type exiting struct {
	*vmdouble.Counter
	exited chan struct{}
}

func (e *exiting) Exited() <-chan struct{} { return e.exited }

// TestSecondaryWhoseVMDiesFencesItselfAndThePrimaryGoesOnAlone: the secondary's VM dies while its
// lockstepd lives (the kernel killed its QEMU under the launcher's memory limit). Its channel
// would go on acknowledging the log with nothing behind it; it fences itself instead, and the
// primary, which stops hearing it, wins the record and goes on alone.
func TestSecondaryWhoseVMDiesFencesItselfAndThePrimaryGoesOnAlone(t *testing.T) {
	p := newPair(t)
	exited := make(chan struct{})
	p.wrap = map[string]func(*vmdouble.Counter) engine.Engine{"b": func(c *vmdouble.Counter) engine.Engine {
		return &exiting{Counter: c, exited: exited}
	}}
	p.protect(t)
	close(exited)
	waitState(t, p.b, failover.Fenced)
	waitState(t, p.a, failover.Alone)
	if msg := p.b.agent.Status().Message; !strings.Contains(msg, "VM exited") {
		t.Fatalf("the fenced secondary's message %q does not say why", msg)
	}
	if st := p.a.agent.Status(); st.Failovers != 0 {
		t.Fatalf("the primary went on alone with %d failovers, want none (it never stopped running the VM)", st.Failovers)
	}
}

// TestPrimaryNeverTakesARecordThatNamesAnotherMember: a primary whose lockstepd starts after the
// pair's record moved to another member (its secondary went live while this lockstepd was away)
// must not claim the next epoch: it is fenced, runs nothing, and the record stays where it is.
func TestPrimaryNeverTakesARecordThatNamesAnotherMember(t *testing.T) {
	p := newPair(t)
	p.lease.Hold("b", 3)
	a := p.start(t, "a", true, p.tlsA, nil)
	waitState(t, a, failover.Fenced)
	if h := p.lease.Holder(); h.Identity != "b" || h.Epoch != 3 {
		t.Fatalf("the record moved to %+v, want b at epoch 3", h)
	}
	if v := a.engine.Value(); v != 0 {
		t.Fatalf("the fenced primary's VM ran to %d", v)
	}
	if st := a.agent.Status(); st.RunsVM || !strings.Contains(st.Message, "names b") {
		t.Fatalf("fenced primary: %+v", st)
	}
}

// A secondary that went live and was protected again claims a new epoch when its new secondary
// goes silent, so that the new secondary, which knows the epoch the promoted primary holds,
// cannot win too: both sides of a partition claiming never both win.
func TestPromotedPrimaryClaimsANewEpoch(t *testing.T) {
	p := newPair(t)
	p.protect(t)
	p.a.cancel() // the first primary's node dies: b goes live at epoch 3
	_ = p.a.ln.Close()
	waitState(t, p.b, failover.Alone)
	c := p.start(t, "c", false, p.tlsA, nil)
	p.b.agent.SetPeer(context.Background(), agent.Peer{VMI: "c", Node: "node-c", Addr: c.ln.Addr().String()})
	waitState(t, p.b, failover.Protected)
	if st := c.agent.Status(); !st.Synced || st.Epoch != 3 {
		t.Fatalf("the new secondary: %+v, want synchronized at epoch 3", st)
	}
	c.cancel() // b hears nothing from c, and claims
	_ = c.ln.Close()
	deadline := time.Now().Add(10 * time.Second)
	for p.b.agent.Status().Epoch != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the promoted primary after its secondary went silent: %+v, want it to hold epoch 4", p.b.agent.Status())
		}
		time.Sleep(time.Millisecond)
	}
	waitState(t, p.b, failover.Alone)
	// What c's own claim would meet had it been partitioned rather than dead.
	if _, err := p.lease.Side("c").Claim(context.Background(), 3); !errors.Is(err, engine.ErrLost) {
		t.Fatalf("a claim from the epoch the new secondary knew: %v, want it lost", err)
	}
}

// dropping is an engine that asks to drop its secondary when drop is closed (a COLO protection
// that broke while the secondary still answers) and reports DropSecondary's answer with the
// record's epoch when it came.
type dropping struct {
	*vmdouble.Counter
	lease   *leasedouble.Lease
	drop    chan struct{}
	answers chan dropAnswer
}

type dropAnswer struct {
	err   error
	epoch uint64
}

func (d *dropping) Run(ctx context.Context, rec engine.Recorder) error {
	go func() {
		select {
		case <-d.drop:
			err := rec.DropSecondary(ctx, "the protection broke")
			d.answers <- dropAnswer{err, d.lease.Holder().Epoch}
		case <-ctx.Done():
		}
	}()
	return d.Counter.Run(ctx, rec)
}

// A primary whose engine can no longer keep its secondary in step, though the secondary still
// answers, claims the pair from it before the engine lets anything leave: DropSecondary returns
// once this side holds a new epoch, which the secondary's own claim can never take; when the
// record cannot be reached, it returns ErrFenced with the side fenced.
func TestAPrimaryClaimsThePairFromTheSecondaryItDrops(t *testing.T) {
	for _, reachable := range []bool{true, false} {
		t.Run(fmt.Sprintf("record reachable %v", reachable), func(t *testing.T) {
			p := newPair(t)
			p.detect = time.Minute // the secondary never goes silent here
			eng := &dropping{lease: p.lease, drop: make(chan struct{}), answers: make(chan dropAnswer, 1)}
			p.wrap = map[string]func(*vmdouble.Counter) engine.Engine{"a": func(c *vmdouble.Counter) engine.Engine {
				eng.Counter = c
				return eng
			}}
			p.protect(t)
			p.lease.SetDown(!reachable)
			close(eng.drop)
			got := <-eng.answers
			if !reachable {
				if !errors.Is(got.err, engine.ErrFenced) || p.a.agent.State() != failover.Fenced {
					t.Fatalf("without the record: DropSecondary %v, state %s; want ErrFenced and fenced", got.err, p.a.agent.State())
				}
				return
			}
			if got.err != nil || got.epoch != 3 {
				t.Fatalf("DropSecondary %v with the record at epoch %d; want nil once the primary holds epoch 3", got.err, got.epoch)
			}
			if h := p.lease.Holder(); h.Identity != "a" || h.Epoch != 3 {
				t.Fatalf("the record: %+v, want a at epoch 3", h)
			}
			// No log goes to the secondary it dropped: b, which still answers, is never
			// synchronized at epoch 3, and a stays alone until a new secondary comes.
			for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				if st, bs := p.a.agent.Status(), p.b.agent.Status(); st.State != failover.Alone || bs.Epoch != 2 {
					t.Fatalf("after dropping b: a %s, b at epoch %d; want a alone, b never admitting epoch 3", st.State, bs.Epoch)
				}
			}
			if _, err := p.lease.Side("b").Claim(context.Background(), 2); !errors.Is(err, engine.ErrLost) {
				t.Fatalf("the dropped secondary's claim from the epoch it held: %v, want it lost", err)
			}
		})
	}
}

// A secondary holds the state of the epoch whose entries it applied: once a primary of a newer
// epoch was admitted (one that claimed the pair against it, and released outputs it never saw),
// it is not synchronized until it applied that primary's first entry, and the operator's
// promotion does nothing.
func TestASecondaryThatOnlyHeardANewerEpochIsNotPromoted(t *testing.T) {
	p := newPair(t)
	p.detect = time.Minute // b goes live only if promoted
	p.protect(t)
	p.a.cancel() // a stops; a primary of epoch 3 connects to b and logs nothing yet
	_ = p.a.ln.Close()
	cfg := p.tlsA
	cfg.TLS = p.ca.TLSConfig(t, "node-a")
	newer := channel.NewPrimary(cfg, p.b.ln.Addr().String(), 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = newer.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for p.b.agent.Status().Epoch != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the epoch 3 primary was never admitted: %+v", p.b.agent.Status())
		}
		time.Sleep(time.Millisecond)
	}
	if p.b.agent.Status().Synced {
		t.Fatal("the secondary reports itself synchronized at epoch 3, having applied nothing of it")
	}
	p.b.agent.Promote(context.Background())
	time.Sleep(300 * time.Millisecond)
	if st := p.b.agent.Status(); st.State != failover.Replicating || p.lease.Holder().Epoch != 2 {
		t.Fatalf("after a promotion: %s, the record at epoch %d; want it still replicating, the record untouched", st.State, p.lease.Holder().Epoch)
	}
	if _, err := newer.Append(ctx, binary.BigEndian.AppendUint64(nil, 7)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !p.b.agent.Status().Synced {
		if time.Now().After(deadline) {
			t.Fatalf("the secondary never synchronized at epoch 3: %+v", p.b.agent.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// An alone primary that has begun a log to a new secondary claims the pair from it too: what it
// logged may already have made that secondary synchronized at this epoch (COLO's "ready"),
// before the acknowledgement that makes the pair Protected came back.
func TestAnAlonePrimaryWithALogOutClaimsFromItsNewSecondary(t *testing.T) {
	p := newPair(t)
	eng := &dropping{lease: p.lease, drop: make(chan struct{}), answers: make(chan dropAnswer, 1)}
	p.wrap = map[string]func(*vmdouble.Counter) engine.Engine{"a": func(c *vmdouble.Counter) engine.Engine {
		eng.Counter = c
		return eng
	}}
	p.a = p.start(t, "a", true, p.tlsA, nil)
	waitState(t, p.a, failover.Alone) // epoch 2, no secondary yet
	// A secondary whose node accepts the connection and says nothing: the log is out, unacknowledged.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mute.Close() }()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
		}
	}()
	p.a.agent.SetPeer(context.Background(), agent.Peer{VMI: "b", Node: "node-b", Addr: mute.Addr().String()})
	deadline := time.Now().Add(10 * time.Second)
	for p.a.agent.Status().Peer.VMI != "b" {
		if time.Now().After(deadline) {
			t.Fatal("the primary never took its new secondary")
		}
		time.Sleep(time.Millisecond)
	}
	close(eng.drop)
	got := <-eng.answers
	if got.err != nil || got.epoch != 3 || p.a.agent.State() != failover.Alone {
		t.Fatalf("DropSecondary %v with the record at epoch %d, the primary %s; want nil once it holds epoch 3, alone", got.err, got.epoch, p.a.agent.State())
	}
}

// A fenced side's agent has ended its loop, but lockstepd tells it of its peer on every
// reconcile of the pair until its VMI is deleted (after an API server outage, every 2 s): none
// of these calls may wait for the loop that will never read them. The seventeenth once held
// lockstepd's only reconcile worker for good. DropSecondary answers that the side is fenced.
func TestAFencedAgentIsToldOfItsPeerWithoutWaiting(t *testing.T) {
	p := newPair(t)
	a := p.start(t, "a", true, p.tlsA, nil)
	waitState(t, a, failover.Alone)
	a.agent.Fence(context.Background(), "the operator fenced it")
	select {
	case err := <-a.done:
		if !errors.Is(err, engine.ErrFenced) {
			t.Fatalf("the fenced agent's Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fenced agent's Run did not return")
	}
	done := make(chan error, 1)
	go func() {
		for range 100 {
			a.agent.SetPeer(context.Background(), agent.Peer{VMI: "b", Node: "node-b", Addr: "127.0.0.1:1"})
		}
		done <- a.agent.DropSecondary(context.Background(), "the protection broke")
	}()
	select {
	case err := <-done:
		if !errors.Is(err, engine.ErrFenced) {
			t.Fatalf("DropSecondary on a fenced side: %v, want ErrFenced", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("telling a fenced agent of its peer 100 times, then dropping its secondary, did not return in 10 s")
	}
}
