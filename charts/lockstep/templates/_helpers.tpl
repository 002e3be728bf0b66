{{/* Labels of every object the chart makes. */}}
{{- define "lockstep.labels" -}}
app.kubernetes.io/name: lockstep
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The selector labels of a component. */}}
{{- define "lockstep.selector" -}}
app.kubernetes.io/name: lockstep
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/* The image of the operator, lockstepd and the hook. */}}
{{- define "lockstep.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* lockstep's QEMU image, which members' launchers mount (config/kubevirt/member-qemu-policy.yaml).
Nil-safe: a release upgraded with --reuse-values from a chart without colo.qemuImage has none. */}}
{{- define "lockstep.qemuImage" -}}
{{- $q := .Values.colo.qemuImage | default dict -}}
{{- $repository := $q.repository | default "ghcr.io/lockstep-dev/lockstep-qemu" -}}
{{- if $q.digest -}}
{{ $repository }}@{{ $q.digest }}
{{- else -}}
{{ $repository }}:{{ $q.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "lockstep.qemuImagePullPolicy" -}}
{{- (.Values.colo.qemuImage | default dict).pullPolicy | default "IfNotPresent" -}}
{{- end -}}

{{/* The objects of a multi-document file under files/ that make manifests copies from config/. */}}
{{- define "lockstep.docs" -}}
{{- $docs := list -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" (.root.Files.Get .file) -1 -}}
{{- $o := fromYaml $doc -}}
{{- if and $o (hasKey $o "kind") -}}
{{- $docs = append $docs $o -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $docs) -}}
{{- end -}}

{{/* The objects of a file under files/ that make manifests renders from config/ (kustomize
build), moved into the release's namespace: their own and their subjects'. */}}
{{- define "lockstep.fromConfig" -}}
{{- $root := .root -}}
{{- range (include "lockstep.docs" .  | fromYaml).items }}
{{- $o := . -}}
{{- if $o.metadata.namespace }}{{ $_ := set $o.metadata "namespace" $root.Release.Namespace }}{{ end -}}
{{- range ($o.subjects | default list) }}{{ if .namespace }}{{ $_ := set . "namespace" $root.Release.Namespace }}{{ end }}{{ end -}}
{{- $_ := set $o.metadata "labels" (merge (include "lockstep.labels" $root | fromYaml) ($o.metadata.labels | default dict)) }}
---
{{ toYaml $o | replace "system:serviceaccount:lockstep-system:" (printf "system:serviceaccount:%s:" $root.Release.Namespace) }}
{{- end }}
{{- end -}}
