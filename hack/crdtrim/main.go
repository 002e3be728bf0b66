// Command crdtrim removes the field descriptions under spec.template.spec of the FaultTolerantVM
// CRD: that is KubeVirt's VirtualMachineInstanceSpec, whose descriptions would make the CRD too
// large for client-side `kubectl apply` (its last-applied annotation is limited to 256 KiB).
// lockstep's own fields keep theirs, so `kubectl explain ftvm.spec` stays useful.
//
//	go run ./hack/crdtrim config/crd/bases/ft.lockstep.dev_faulttolerantvms.yaml
package main

import (
	"bytes"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: crdtrim CRD.yaml")
		os.Exit(2)
	}
	if err := trim(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "crdtrim:", err)
		os.Exit(1)
	}
}

func trim(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		return err
	}
	versions, _ := dig(crd, "spec", "versions").([]any)
	if len(versions) == 0 {
		return fmt.Errorf("%s: no spec.versions", path)
	}
	for _, v := range versions {
		tmplSpec, ok := dig(v, "schema", "openAPIV3Schema", "properties", "spec", "properties", "template", "properties", "spec").(map[string]any)
		if !ok {
			return fmt.Errorf("%s: no spec.template.spec in the schema", path)
		}
		description := tmplSpec["description"]
		stripSchema(tmplSpec)
		if description != nil {
			tmplSpec["description"] = description // the template's own doc stays
		}
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte("---\n"), bytes.TrimSpace(out)...), 0o644)
}

// dig walks nested maps by key.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// stripSchema deletes the description of a schema and of every schema within it, walking the
// schema's structure (properties, items, additionalProperties, allOf/anyOf/oneOf), so that a field
// named "description" or "type" is never taken for a keyword.
func stripSchema(v any) {
	s, ok := v.(map[string]any)
	if !ok {
		return
	}
	delete(s, "description")
	if props, ok := s["properties"].(map[string]any); ok {
		for _, child := range props {
			stripSchema(child)
		}
	}
	switch items := s["items"].(type) {
	case map[string]any:
		stripSchema(items)
	case []any:
		for _, child := range items {
			stripSchema(child)
		}
	}
	stripSchema(s["additionalProperties"])
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		if list, ok := s[k].([]any); ok {
			for _, child := range list {
				stripSchema(child)
			}
		}
	}
}
