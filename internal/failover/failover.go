// Package failover is the go-live decision of one side of a pair (white paper 1.4), as a pure
// state machine: what lockstepd does when it stops hearing its peer, and what it may do with the
// outputs it holds. lockstepd feeds it events (the channel's silence detector, the arbiter's
// answers) and carries out the actions it returns (claim the Lease, go live, fence).
//
// The rule it keeps: a side releases outputs without the peer's acknowledgement only after it
// won the pair's Lease at a newer epoch; a side that lost the Lease, or could not reach it, never
// releases output again and stops its VM. The Lease's compare-and-set lets one side win an epoch,
// so at most one side is ever live alone.
//
// The record is also a lease with a term (internal/term): a side that runs the VM renews it, and
// one that could not renew within the term stops releasing output and pauses its VM (Lapsed)
// before the operator, which waits out the term on its own clock, may start the VM elsewhere. A
// renewal that goes through again resumes it; one that finds the record moved on fences it, as
// does the end of its term without one (internal/term's StopAt).
package failover

import "fmt"

// State is a side's state.
type State int

const (
	// Protected: a primary streaming to a live secondary; outputs leave on acknowledgement.
	Protected State = iota
	// Replicating: a secondary applying the log; it releases nothing.
	Replicating
	// Claiming: the peer went silent and the side asked for the Lease; nothing is released.
	Claiming
	// Alone: the side won the Lease; it runs as a primary without a secondary and releases its
	// outputs (there is no one to wait for) until a new secondary joins.
	Alone
	// Fenced: the side lost, or could not reach the arbiter. It never releases output again and
	// its VM is stopped. Final.
	Fenced
	// Lapsed: a side that ran the VM (Protected or Alone) could not renew the pair's record
	// within its term: it releases nothing and its VM is paused, so that the operator may start
	// the VM elsewhere once the term has passed. A renewal that goes through resumes it.
	Lapsed
)

func (s State) String() string {
	return [...]string{"Protected", "Replicating", "Claiming", "Alone", "Fenced", "Lapsed"}[s]
}

// Event is something lockstepd observed.
type Event int

const (
	// PeerSilent: the peer said nothing for the detection timeout.
	PeerSilent Event = iota
	// ClaimWon: the arbiter gave this side the next epoch.
	ClaimWon
	// ClaimLost: the other side holds a newer epoch.
	ClaimLost
	// ClaimFailed: the arbiter could not be reached in time.
	ClaimFailed
	// SecondaryJoined: a new secondary caught up with this Alone primary; protection resumes.
	SecondaryJoined
	// SecondaryDropped: the primary's engine can no longer keep its secondary in step, though
	// the secondary still answers (a COLO protection that broke): before the VM's output leaves
	// without it, the primary claims the pair from it, as from a silent one. An Alone primary
	// claims too: lockstepd sends it only with a log out to a secondary, which may have taken the
	// epoch's state before its acknowledgement made the pair Protected.
	SecondaryDropped
	// TermLapsed: the side runs the VM and its last renewal of the pair's record is older than
	// the term less the holder's margin.
	TermLapsed
	// Renewed: a renewal of the pair's record went through at the side's epoch.
	Renewed
	// RecordMoved: a renewal found the record held by another member or at a newer epoch: the
	// VM runs, or is to run, elsewhere.
	RecordMoved
	// TermEnded: a lapsed side's term ran out without a renewal (T - T/12, internal/term): the
	// operator may soon start the VM elsewhere, and a paused VM would keep its disks (their locks,
	// their attachments) from the copy that starts there.
	TermEnded
)

func (e Event) String() string {
	return [...]string{"PeerSilent", "ClaimWon", "ClaimLost", "ClaimFailed", "SecondaryJoined", "SecondaryDropped",
		"TermLapsed", "Renewed", "RecordMoved", "TermEnded"}[e]
}

// Action is what lockstepd must do.
type Action int

const (
	// Claim: ask the arbiter for the next epoch.
	Claim Action = iota
	// GoLive: a secondary takes over: the engine fails over and the VM's network is attached.
	GoLive
	// ReleaseHeld: outputs held for a peer that is gone may leave (after a won claim).
	ReleaseHeld
	// Fence: drop every held output, refuse any new one, stop the VM.
	Fence
	// StartSecondary: ask for a new secondary (the operator does it; lockstepd reports Alone).
	StartSecondary
	// Pause: pause the VM (its outputs are already held by the state).
	Pause
	// Resume: run the paused VM again.
	Resume
	// ReleaseAcked: outputs the secondary acknowledged while the side was lapsed may leave.
	ReleaseAcked
)

func (a Action) String() string {
	return [...]string{"Claim", "GoLive", "ReleaseHeld", "Fence", "StartSecondary", "Pause", "Resume", "ReleaseAcked"}[a]
}

// Side is one side's decision state.
type Side struct {
	State State
	// WasPrimary says which side this was before it started claiming.
	WasPrimary bool
	// LapsedFrom is the state a Lapsed side returns to when it renews (Protected or Alone).
	LapsedFrom State
}

// NewPrimary and NewSecondary are the sides of a protected pair.
func NewPrimary() Side   { return Side{State: Protected, WasPrimary: true} }
func NewSecondary() Side { return Side{State: Replicating} }

// MayRelease says whether the side may release outputs without an acknowledgement.
func (s Side) MayRelease() bool { return s.State == Alone }

// MayReleaseAcked says whether outputs the peer acknowledged may leave.
func (s Side) MayReleaseAcked() bool { return s.State == Protected || s.State == Alone }

// ofTerm says whether the event is one of the record's term.
func (e Event) ofTerm() bool {
	return e == TermLapsed || e == Renewed || e == RecordMoved || e == TermEnded
}

// onTerm applies the events of the record's term, and every event to a Lapsed side: paused and
// holding everything, it waits for its renewal to decide (a claim from a silent peer now would
// race it; once renewed, the detector fires again).
func (s *Side) onTerm(e Event) []Action {
	switch {
	case e == TermLapsed && (s.State == Protected || s.State == Alone):
		s.LapsedFrom, s.State = s.State, Lapsed
		return []Action{Pause}
	case e == Renewed && s.State == Lapsed:
		s.State = s.LapsedFrom
		if s.State == Alone {
			return []Action{Resume, ReleaseHeld}
		}
		return []Action{Resume, ReleaseAcked}
	case e == RecordMoved && s.State != Claiming:
		// (A claim under way reads the record and decides.)
		s.State = Fenced
		return []Action{Fence}
	case e == TermEnded && s.State == Lapsed:
		s.State = Fenced
		return []Action{Fence}
	case e == SecondaryJoined && s.LapsedFrom == Alone:
		// Its acknowledgement came before the lapse: the side resumes protected.
		s.LapsedFrom, s.WasPrimary = Protected, true
	}
	// A lapse of a side that does not run the VM (or that claims: the claim decides), a renewal
	// of one not lapsed.
	return nil
}

// On applies an event and returns the actions to take, in order. An event that does not apply in
// the current state is an error and changes nothing.
func (s *Side) On(e Event) ([]Action, error) {
	switch {
	case s.State == Fenced:
		return nil, nil // final: nothing undoes a fence
	case s.State == Lapsed || e.ofTerm():
		return s.onTerm(e), nil
	case e == PeerSilent && (s.State == Protected || s.State == Replicating):
		s.WasPrimary = s.State == Protected
		s.State = Claiming
		return []Action{Claim}, nil
	case e == SecondaryDropped && (s.State == Protected || s.State == Alone):
		s.WasPrimary = true
		s.State = Claiming
		return []Action{Claim}, nil
	case (e == PeerSilent || e == SecondaryDropped) && (s.State == Claiming || s.State == Alone):
		return nil, nil // already handling it
	case s.State == Claiming && e == ClaimWon:
		s.State = Alone
		if s.WasPrimary {
			return []Action{ReleaseHeld, StartSecondary}, nil
		}
		return []Action{GoLive, ReleaseHeld, StartSecondary}, nil
	case s.State == Claiming && (e == ClaimLost || e == ClaimFailed):
		s.State = Fenced
		return []Action{Fence}, nil
	case s.State == Alone && e == SecondaryJoined:
		s.State, s.WasPrimary = Protected, true
		return nil, nil
	}
	return nil, fmt.Errorf("event %s does not apply to a side in state %s", e, s.State)
}
