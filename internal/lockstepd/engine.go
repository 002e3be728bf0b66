package lockstepd

import "github.com/lockstep-dev/lockstep/internal/engine"

// The engine contract lives in internal/engine, which engines import; these names keep the
// daemon's code short.
type (
	Engine         = engine.Engine
	Recorder       = engine.Recorder
	Unprotector    = engine.Unprotector
	StreamReporter = engine.StreamReporter
	StreamStats    = engine.StreamStats
)

// ErrFenced is engine.ErrFenced.
var ErrFenced = engine.ErrFenced
