package virtlauncher

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	virtv1 "kubevirt.io/api/core/v1"
)

// NoCloudISO writes the ISO of the VMI's cloudInitNoCloud volume to file, as KubeVirt v1.9's
// launcher makes it: an ISO 9660 image with Joliet and Rock Ridge, labelled cidata, holding
// meta-data (instance-id: the VMI's firmware UUID, which both members of a pair share;
// local-hostname: the VMI's hostname, or its name), user-data and, when the volume has network
// data, network-config. Like the launcher, it uses genisoimage (hack/debian-guest.sh installs it).
func NoCloudISO(vmi *virtv1.VirtualMachineInstance, volume, file string) error {
	var ci *virtv1.CloudInitNoCloudSource
	for _, v := range vmi.Spec.Volumes {
		if v.Name == volume {
			ci = v.CloudInitNoCloud
		}
	}
	if ci == nil {
		return fmt.Errorf("volume %s is not a cloudInitNoCloud volume", volume)
	}
	if ci.UserDataSecretRef != nil || ci.NetworkDataSecretRef != nil || ci.UserDataBase64 != "" || ci.NetworkDataBase64 != "" {
		return fmt.Errorf("volume %s: the double takes user and network data inline (userData, networkData)", volume)
	}
	instanceID := ""
	if fw := vmi.Spec.Domain.Firmware; fw != nil {
		instanceID = string(fw.UUID)
	}
	if instanceID == "" {
		return fmt.Errorf("the VMI has no firmware UUID: KubeVirt's instance-id would be random, and differ between the members")
	}
	hostname := vmi.Spec.Hostname
	if hostname == "" {
		hostname = vmi.Name
	}
	dir, err := os.MkdirTemp("", "cidata")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	files := map[string]string{
		"meta-data": fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", instanceID, hostname),
		"user-data": ci.UserData,
	}
	if ci.NetworkData != "" {
		files["network-config"] = ci.NetworkData
	}
	args := []string{"-quiet", "-output", file, "-volid", "cidata", "-joliet", "-rock"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
		args = append(args, filepath.Join(dir, name))
	}
	if out, err := exec.Command("genisoimage", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("genisoimage: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
