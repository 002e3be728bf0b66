package ftvmctl

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// operationTypes are the plugin's commands for vSphere FT's operations.
var operationTypes = map[string]ftv1.OperationType{
	"test-failover":     ftv1.OperationTestFailover,
	"restart-secondary": ftv1.OperationTestRestartSecondary,
	"migrate-secondary": ftv1.OperationMigrateSecondary,
}

// NewOperation is the FaultTolerantVMOperation a command asks for: named after the VM and the
// operation, with a suffix the API server picks.
func NewOperation(namespace, ftvm string, typ ftv1.OperationType, node string) *ftv1.FaultTolerantVMOperation {
	return &ftv1.FaultTolerantVMOperation{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: ftvm + "-" + strings.ToLower(string(typ)) + "-"},
		Spec:       ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: ftvm, Type: typ, Node: node},
	}
}

// runOperation creates the operation, after checking that its FaultTolerantVM exists (the
// operator would only fail it later), and with wait follows it until it ends.
func runOperation(ctx context.Context, c client.Client, op *ftv1.FaultTolerantVMOperation, wait time.Duration, say func(string, ...any)) error {
	f := &ftv1.FaultTolerantVM{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: op.Namespace, Name: op.Spec.FaultTolerantVMName}, f); err != nil {
		return fmt.Errorf("FaultTolerantVM %s/%s: %w", op.Namespace, op.Spec.FaultTolerantVMName, err)
	}
	if err := c.Create(ctx, op); err != nil {
		return fmt.Errorf("creating the %s operation: %w", op.Spec.Type, err)
	}
	say("faulttolerantvmoperation.ft.lockstep.dev/%s created", op.Name)
	if wait <= 0 {
		return nil
	}
	return waitOperation(ctx, c, op, wait, say)
}

// waitOperation polls the operation until it succeeds or fails, saying each new phase.
func waitOperation(ctx context.Context, c client.Client, op *ftv1.FaultTolerantVMOperation, wait time.Duration, say func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	last := ""
	for {
		got := &ftv1.FaultTolerantVMOperation{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(op), got); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%s did not end within %s (kubectl ftvm waits no longer; the operator goes on)", op.Name, wait)
			}
			return fmt.Errorf("following %s: %w", op.Name, err)
		}
		if now := string(got.Status.Phase) + ": " + got.Status.Message; got.Status.Phase != "" && now != last {
			say("%s %s", op.Name, now)
			last = now
		}
		switch got.Status.Phase {
		case ftv1.OperationSucceeded:
			if r := got.Status.Result; r != nil {
				say("primary %s, secondary %s", member(r.Primary), member(r.Secondary))
			}
			return nil
		case ftv1.OperationFailed:
			return fmt.Errorf("%s failed: %s", op.Name, got.Status.Message)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is still %s after %s (kubectl ftvm waits no longer; the operator goes on)", op.Name, orDash(string(got.Status.Phase)), wait)
		case <-time.After(time.Second):
		}
	}
}

// setProtection sets spec.protection (Enabled, Suspended or Disabled) with a merge patch.
func setProtection(ctx context.Context, c client.Client, namespace, name string, p ftv1.Protection) error {
	f := &ftv1.FaultTolerantVM{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, f); err != nil {
		return fmt.Errorf("FaultTolerantVM %s/%s: %w", namespace, name, err)
	}
	base := f.DeepCopy()
	f.Spec.Protection = p
	return c.Patch(ctx, f, client.MergeFrom(base))
}

// protectionOf reads the protection a command names (enabled, suspended, disabled).
func protectionOf(word string) (ftv1.Protection, error) {
	for _, p := range []ftv1.Protection{ftv1.ProtectionEnabled, ftv1.ProtectionSuspended, ftv1.ProtectionDisabled} {
		if strings.EqualFold(word, string(p)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("protection %q: want enabled, suspended or disabled", word)
}
