package chaos

import (
	"fmt"
	"os"
	"strconv"
)

// FromEnv reads a schedule's seed and length from the environment variables seedVar and
// stepsVar; unset, they are clockSeed and defaultSteps.
func FromEnv(seedVar, stepsVar string, clockSeed uint64, defaultSteps int) (uint64, int, error) {
	seed, steps := clockSeed, defaultSteps
	if s := os.Getenv(seedVar); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", seedVar, err)
		}
		seed = v
	}
	if s := os.Getenv(stepsVar); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", stepsVar, err)
		}
		steps = v
	}
	return seed, steps, nil
}
