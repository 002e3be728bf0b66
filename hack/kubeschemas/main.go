// Command kubeschemas writes the JSON schemas that kubeconform validates manifests against (make
// lint-manifests), generated here rather than downloaded: it starts the pinned kube-apiserver
// (make envtest-assets) with every API version served and lockstep's CRDs and the test CRDs
// (make test-crds: KubeVirt, Multus, cert-manager, the Prometheus operator) installed, reads its
// OpenAPI v3 documents, and writes one standalone schema per kind:
//
//	go run ./hack/kubeschemas -out bin/schemas
//
// A kind's file is OUT/<group, or v1 for the core group>/<version>/<kind, lower case>.json,
// which kubeconform finds with
// -schema-location 'OUT/{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json'.
// Each schema is strict: an object that lists its properties allows no others, unless it keeps
// unknown fields (x-kubernetes-preserve-unknown-fields), so that kubeconform -strict reports a
// misspelt or misplaced field.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func main() {
	out := flag.String("out", "bin/schemas", "directory to write the schemas into")
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := run(*root, *out); err != nil {
		fmt.Fprintln(os.Stderr, "kubeschemas:", err)
		os.Exit(1)
	}
}

func run(root, out string) error {
	paths := []string{filepath.Join(root, "config", "crd", "bases")}
	for _, g := range []string{"kubevirt", "multus", "cert-manager", "monitoring"} {
		paths = append(paths, filepath.Join(root, "bin", "test-crds", g))
	}
	env := &envtest.Environment{BinaryAssetsDirectory: filepath.Join(root, "bin", "k8s"), CRDDirectoryPaths: paths, ErrorIfCRDPathMissing: true}
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		env.BinaryAssetsDirectory = ""
	}
	env.ControlPlane.GetAPIServer().Configure().Set("runtime-config", "api/all=true")
	cfg, err := env.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	get := func(path string, into any) error {
		resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + path)
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
		}
		return json.Unmarshal(body, into)
	}
	// The API server publishes a CRD's schema a moment after the CRD is established: wait until
	// every CRD's kinds are in its documents.
	want := map[string]bool{}
	for _, crd := range env.CRDs {
		for _, v := range crd.Spec.Versions {
			if v.Served {
				want[crd.Spec.Group+"/"+v.Name+"/"+crd.Spec.Names.Kind] = true
			}
		}
	}
	var docs map[string]map[string]any
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		if docs, err = documents(get); err != nil {
			return err
		}
		missing := missingKinds(docs, want)
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server never published the schemas of %v", missing)
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	written := 0
	for _, schemas := range docs {
		n, err := writeKinds(out, schemas)
		if err != nil {
			return err
		}
		written += n
	}
	if written == 0 {
		return fmt.Errorf("the API server's OpenAPI documents named no kinds")
	}
	fmt.Fprintf(os.Stderr, "kubeschemas: %d kinds written to %s\n", written, out)
	return nil
}

// documents reads every group version's OpenAPI v3 document: its schemas, by path.
func documents(get func(string, any) error) (map[string]map[string]any, error) {
	var index struct {
		Paths map[string]struct {
			ServerRelativeURL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	if err := get("/openapi/v3", &index); err != nil {
		return nil, err
	}
	out := map[string]map[string]any{}
	for name, p := range index.Paths {
		if !strings.HasPrefix(name, "api/") && !strings.HasPrefix(name, "apis/") {
			continue
		}
		var doc struct {
			Components struct {
				Schemas map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := get(p.ServerRelativeURL, &doc); err != nil {
			return nil, err
		}
		out[name] = doc.Components.Schemas
	}
	return out, nil
}

// missingKinds are the "group/version/kind"s of want that no document defines.
func missingKinds(docs map[string]map[string]any, want map[string]bool) []string {
	have := map[string]bool{}
	for _, schemas := range docs {
		for _, s := range schemas {
			m, _ := s.(map[string]any)
			gvks, _ := m["x-kubernetes-group-version-kind"].([]any)
			for _, g := range gvks {
				gvk, _ := g.(map[string]any)
				have[fmt.Sprintf("%v/%v/%v", gvk["group"], gvk["version"], gvk["kind"])] = true
			}
		}
	}
	var missing []string
	for k := range want {
		if !have[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	return missing
}

const refPrefix = "#/components/schemas/"

// writeKinds writes a standalone schema for every kind that schemas define.
func writeKinds(out string, schemas map[string]any) (int, error) {
	names := make([]string, 0, len(schemas))
	for n := range schemas {
		names = append(names, n)
	}
	sort.Strings(names)
	n := 0
	for _, name := range names {
		s, _ := schemas[name].(map[string]any)
		gvks, _ := s["x-kubernetes-group-version-kind"].([]any)
		if len(gvks) != 1 { // none: not a kind; several: an options type every group shares
			continue
		}
		gvk, _ := gvks[0].(map[string]any)
		group, _ := gvk["group"].(string)
		version, _ := gvk["version"].(string)
		kind, _ := gvk["kind"].(string)
		if group == "" {
			group = "v1"
		}
		defs := map[string]any{}
		closure(schemas, name, defs)
		file := map[string]any{"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/" + name, "definitions": defs}
		raw, err := json.MarshalIndent(strict(file), "", " ")
		if err != nil {
			return n, err
		}
		dir := filepath.Join(out, group, version)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return n, err
		}
		if err := os.WriteFile(filepath.Join(dir, strings.ToLower(kind)+".json"), raw, 0o644); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// closure adds name and every schema it refers to, transitively, to defs.
func closure(schemas map[string]any, name string, defs map[string]any) {
	if _, done := defs[name]; done {
		return
	}
	s, ok := schemas[name]
	if !ok {
		return
	}
	defs[name] = s
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			if ref, ok := t["$ref"].(string); ok && strings.HasPrefix(ref, refPrefix) {
				closure(schemas, strings.TrimPrefix(ref, refPrefix), defs)
			}
			for _, c := range t {
				walk(c)
			}
		case []any:
			for _, c := range t {
				walk(c)
			}
		}
	}
	walk(s)
}

// strict is schema s with its references pointing into "definitions", and every object schema
// that lists its properties closed to others, unless it keeps unknown fields. It walks s as a
// schema (a field named "properties" is a property, not a keyword).
func strict(s any) any {
	t, ok := s.(map[string]any)
	if !ok {
		return s // true, false
	}
	out := make(map[string]any, len(t)+1)
	for k, v := range t {
		switch k {
		case "properties", "patternProperties", "definitions":
			m, _ := v.(map[string]any)
			sub := make(map[string]any, len(m))
			for name, c := range m {
				sub[name] = strict(c)
			}
			out[k] = sub
		case "items", "additionalProperties", "not":
			if list, ok := v.([]any); ok {
				out[k] = strictAll(list)
			} else {
				out[k] = strict(v)
			}
		case "allOf", "anyOf", "oneOf":
			list, _ := v.([]any)
			out[k] = strictAll(list)
		case "$ref":
			ref, _ := v.(string)
			if strings.HasPrefix(ref, refPrefix) {
				ref = "#/definitions/" + strings.TrimPrefix(ref, refPrefix)
			}
			out[k] = ref
		default:
			out[k] = v
		}
	}
	_, props := t["properties"].(map[string]any)
	_, additional := t["additionalProperties"]
	preserve, _ := t["x-kubernetes-preserve-unknown-fields"].(bool)
	if props && !additional && !preserve {
		out["additionalProperties"] = false
	}
	return out
}

func strictAll(list []any) []any {
	out := make([]any, len(list))
	for i, c := range list {
		out[i] = strict(c)
	}
	return out
}
