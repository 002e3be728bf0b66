//go:build fullstack

package fullstack

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// domainStates asks every libvirt daemon of the hosts (one per member, as each virt-launcher has
// its own) for its domains' states: domain name ("<namespace>_<vmi>") -> libvirt's state
// ("running", "paused", "shut off", ...). A daemon that does not answer (its host died, its
// launcher is gone) is left out.
func domainStates() map[string]string {
	socks, _ := filepath.Glob(filepath.Join(lc.HostsDir(), "n*", "m", "*", "lv", "run", "libvirt-sock"))
	states := map[string]string{}
	for _, sock := range socks {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := exec.CommandContext(ctx, "virsh", "-c", "qemu+unix:///system?socket="+sock, "list", "--all").Output()
		cancel()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			// " 1    default_counter-1   running" (the state may be two words: "shut off")
			f := strings.Fields(line)
			if len(f) >= 3 && strings.HasPrefix(f[1], "default_") {
				states[f[1]] = strings.Join(f[2:], " ")
			}
		}
	}
	return states
}

// domainSampler samples the VM's domains until stopped, and keeps every sample in which the
// watched domain ran (not paused) while another member of the VM ran too: two live copies.
type domainSampler struct {
	watched string
	stopped chan struct{}
	done    chan struct{}

	mu         sync.Mutex
	last       map[string]string
	samples    int
	violations []string
}

func sampleDomains(watched string) *domainSampler {
	s := &domainSampler{watched: watched, stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			states := domainStates()
			s.mu.Lock()
			s.last, s.samples = states, s.samples+1
			if states[watched] == "running" {
				for name, st := range states {
					if name != watched && strings.HasPrefix(name, "default_"+ftvmName+"-") && st == "running" {
						s.violations = append(s.violations, fmt.Sprintf("%s: %s and %s both running", time.Now().Format("15:04:05.000"), watched, name))
					}
				}
			}
			s.mu.Unlock()
			select {
			case <-s.stopped:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return s
}

// state is the watched domain's state at the last sample ("" when no daemon has it).
func (s *domainSampler) state() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[s.watched]
}

// stop ends the sampling and returns the number of samples and the violations.
func (s *domainSampler) stop() (int, []string) {
	close(s.stopped)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.violations
}
