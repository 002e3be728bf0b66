package kubevirtdouble

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestClaimsRemovesTheImagesOfDeletedClaims: the sweep removes the images of claims that are
// gone and keeps the others; a claim deleted later loses its image when it is reconciled.
func TestClaimsRemovesTheImagesOfDeletedClaims(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	storage := t.TempDir()
	image := func(ns, name string) string {
		f := ClaimImage(storage, ns, name)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("disk"), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	exists := func(f string) bool { _, err := os.Stat(f); return err == nil }
	kept, gone := image("default", "counter-disk"), image("default", "counter-2-root")
	other := image("other", "counter-disk")
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "counter-disk"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pvc).Build()
	claims := &Claims{Client: c, Storage: storage, Log: logr.Discard()}
	if err := claims.sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !exists(kept) || exists(gone) || exists(other) {
		t.Fatalf("after the sweep: kept %v, gone %v, other namespace's %v; want true, false, false", exists(kept), exists(gone), exists(other))
	}
	if _, err := claims.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "counter-disk"}}); err != nil || !exists(kept) {
		t.Fatalf("a claim that is there: %v, image kept %v", err, exists(kept))
	}
	if err := c.Delete(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	if _, err := claims.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "counter-disk"}}); err != nil || exists(kept) {
		t.Fatalf("a deleted claim: %v, image kept %v", err, exists(kept))
	}
}
