// domainxml builds inside hack/build-kubevirt.sh's module only (it imports kubevirt.io/kubevirt);
// this file keeps it out of lockstep's module.
module lockstep.local/kubevirt-domainxml

go 1.26
