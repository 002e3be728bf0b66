// Package ftevents reads the events about a FaultTolerantVM, for the envtest and end-to-end
// suites alike.
package ftevents

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// List returns the events about the FaultTolerantVM ns/name.
func List(ctx context.Context, c client.Reader, ns, name string) ([]corev1.Event, error) {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "FaultTolerantVM" && e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out, nil
}

// Reasons lists the reasons of the events about the FaultTolerantVM.
func Reasons(ctx context.Context, c client.Reader, ns, name string) ([]string, error) {
	events, err := List(ctx, c, ns, name)
	reasons := make([]string, 0, len(events))
	for _, e := range events {
		reasons = append(reasons, e.Reason)
	}
	return reasons, err
}

// Messages joins the messages of the FaultTolerantVM's events with the given reason.
func Messages(ctx context.Context, c client.Reader, ns, name, reason string) (string, error) {
	events, err := List(ctx, c, ns, name)
	var msgs []string
	for _, e := range events {
		if e.Reason == reason {
			msgs = append(msgs, e.Message)
		}
	}
	return strings.Join(msgs, "\n"), err
}
