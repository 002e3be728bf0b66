package chaos

import (
	"fmt"
	"os"
	"strconv"
	"time"
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

// BudgetFromEnv is how long a schedule's faults may run before the rest of it is dropped: the
// duration in budgetVar, else defaultBudget when stepsVar is unset, else none (0). A schedule whose
// length was asked for runs whole, so that a seed and a length repeat a run exactly.
func BudgetFromEnv(budgetVar, stepsVar string, defaultBudget time.Duration) (time.Duration, error) {
	if s := os.Getenv(budgetVar); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", budgetVar, err)
		}
		return d, nil
	}
	if os.Getenv(stepsVar) != "" {
		return 0, nil
	}
	return defaultBudget, nil
}
