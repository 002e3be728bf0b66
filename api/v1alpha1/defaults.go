package v1alpha1

// Default sets the defaults of a FaultTolerantVM's spec: the values the CRD's schema defaults
// too, so that an object reads the same whether the defaulting webhook or the API server's
// structural defaulting filled it. It sets only independent values, never one derived from
// another field (a memory request from the guest memory, say): a derived value written into the
// spec would stay behind when a later apply changes what it came from.
func Default(ftvm *FaultTolerantVM) {
	if ftvm.Spec.RunStrategy == "" {
		ftvm.Spec.RunStrategy = RunStrategyRunning
	}
	if ftvm.Spec.Protection == "" {
		ftvm.Spec.Protection = ProtectionEnabled
	}
	if ftvm.Spec.UpdatePolicy == "" {
		ftvm.Spec.UpdatePolicy = UpdatePolicyStaged
	}
	if ftvm.Spec.OnDelete == "" {
		ftvm.Spec.OnDelete = OnDeleteStop
	}
	if ftvm.Spec.DiskRetention == "" {
		ftvm.Spec.DiskRetention = DiskRetentionRetain
	}
}
