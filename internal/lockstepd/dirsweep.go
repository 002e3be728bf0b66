package lockstepd

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"time"

	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// dirSweeper removes the directories of members that are gone. A member's directory
// (<run-dir>/<vmi-uid>, which lockstepd makes for its launcher) outlives its VMI: a node that
// runs members for months would otherwise keep one for every member it ever held. A directory
// goes once no member VMI in the cluster has its UID, on two sweeps at least grace apart, so
// that a launcher pod still terminating after its VMI went has let go of it.
type dirSweeper struct {
	RunDir string
	Reader client.Reader // member VMIs (lockstepd's cache)
	Every  time.Duration
	Grace  time.Duration

	absent map[string]time.Time // directory -> when a sweep first found it without its VMI
}

// Start sweeps every s.Every until ctx ends (a manager.Runnable).
func (s *dirSweeper) Start(ctx context.Context) error {
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			s.sweep(ctx, now)
		}
	}
}

func (s *dirSweeper) sweep(ctx context.Context, now time.Time) {
	logger := log.FromContext(ctx).WithName("member-dirs")
	var vmis virtv1.VirtualMachineInstanceList
	if err := s.Reader.List(ctx, &vmis); err != nil {
		logger.Error(err, "listing the members")
		return
	}
	live := map[string]bool{}
	for _, v := range vmis.Items {
		live[string(v.UID)] = true
	}
	entries, err := os.ReadDir(s.RunDir)
	if err != nil {
		logger.Error(err, "reading the members' directories", "dir", s.RunDir)
		return
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	var gone []string
	s.absent, gone = staleMemberDirs(dirs, live, s.absent, now, s.Grace)
	for _, name := range gone {
		if err := os.RemoveAll(filepath.Join(s.RunDir, name)); err != nil {
			logger.Error(err, "removing the directory of a member that is gone", "uid", name)
			continue
		}
		logger.Info("removed the directory of a member that is gone", "uid", name)
	}
}

// uidName is how a VMI's UID looks (a UUID): only such directories are a member's.
var uidName = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// staleMemberDirs decides which of the member directories dirs go: those named by a UID that no
// live member has, found so by an earlier sweep at least grace before now. It returns what to
// remember for the next sweep (absent: when each such directory was first found without its VMI)
// and the directories to remove.
func staleMemberDirs(dirs []string, live map[string]bool, absent map[string]time.Time, now time.Time, grace time.Duration) (map[string]time.Time, []string) {
	next := map[string]time.Time{}
	var gone []string
	for _, d := range dirs {
		if !uidName.MatchString(d) || live[d] {
			continue
		}
		since, seen := absent[d]
		switch {
		case !seen:
			next[d] = now
		case now.Sub(since) >= grace:
			gone = append(gone, d)
		default:
			next[d] = since
		}
	}
	return next, gone
}
