package kubevirtdouble

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ClaimImage is where the local cluster keeps the image of claim namespace/name (Domains).
func ClaimImage(storage, namespace, name string) string {
	return filepath.Join(storage, namespace, name+".img")
}

// Claims is the local cluster's storage reclaiming its volumes: once a claim is deleted, its
// image under Storage goes, as a provisioner with reclaimPolicy Delete deletes the volume (a
// domain that still has the image open keeps it until it ends, as a mounted volume would be
// kept). Images of claims deleted while the double was down go at its start.
type Claims struct {
	Client  client.Client
	Storage string
	Log     logr.Logger
}

// Reconcile removes the image of a claim that is gone.
func (c *Claims) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	err := c.Client.Get(ctx, req.NamespacedName, &corev1.PersistentVolumeClaim{})
	if !apierrors.IsNotFound(err) {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, c.remove(req.NamespacedName)
}

func (c *Claims) remove(claim types.NamespacedName) error {
	image := ClaimImage(c.Storage, claim.Namespace, claim.Name)
	err := os.Remove(image)
	if err == nil {
		c.Log.Info("the claim is deleted: its image removed", "claim", claim, "image", image)
	}
	if os.IsNotExist(err) {
		return nil
	}
	return err
}

// sweep removes the images whose claims are not there.
func (c *Claims) sweep(ctx context.Context) error {
	var claims corev1.PersistentVolumeClaimList
	if err := c.Client.List(ctx, &claims); err != nil {
		return err
	}
	have := map[string]bool{}
	for _, pvc := range claims.Items {
		have[ClaimImage(c.Storage, pvc.Namespace, pvc.Name)] = true
	}
	images, err := filepath.Glob(filepath.Join(c.Storage, "*", "*.img"))
	if err != nil {
		return err
	}
	for _, image := range images {
		if have[image] {
			continue
		}
		ns := filepath.Base(filepath.Dir(image))
		if err := c.remove(types.NamespacedName{Namespace: ns, Name: strings.TrimSuffix(filepath.Base(image), ".img")}); err != nil {
			return err
		}
	}
	return nil
}

// SetupWithManager watches the claims, and sweeps once the cache has them.
func (c *Claims) SetupWithManager(mgr manager.Manager) error {
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		if err := c.sweep(ctx); err != nil {
			c.Log.Error(err, "removing the images of deleted claims")
		}
		return nil
	})); err != nil {
		return err
	}
	return builder.ControllerManagedBy(mgr).Named("kubevirt-double-claims").For(&corev1.PersistentVolumeClaim{}).Complete(c)
}
