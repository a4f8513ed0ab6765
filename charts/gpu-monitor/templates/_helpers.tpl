{{/*
Shared pieces of the gpu-monitor templates: the namespace, the labels every object carries,
the image reference, and the daemon's configuration (daemonset/config.yaml with the values
applied). Object names are fixed, as in the kustomize base (values.yaml says why).
*/}}

{{/* The namespace of every namespaced object. */}}
{{- define "gpu-monitor.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end }}

{{/*
The namespace the fabric scheduler's probe and idle-check Jobs run in (fabric.jobNamespace.name).
It must not be the daemon's: whoever may create a Job in a namespace may run a pod as any
ServiceAccount there, the daemon's included (docs/fabric.md#rbac-and-namespaces).
*/}}
{{- define "gpu-monitor.jobNamespace" -}}
{{- $jobs := .Values.fabric.jobNamespace.name -}}
{{- if eq $jobs (include "gpu-monitor.namespace" .) -}}
{{- fail (printf "fabric.jobNamespace.name (%s) must differ from the release namespace: a Job creator there could run pods as the daemon's ServiceAccount" $jobs) -}}
{{- end -}}
{{- $jobs -}}
{{- end }}

{{/* Helm's standard labels (the ones the kustomize base does not set). */}}
{{- define "gpu-monitor.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
An object's metadata: name, namespace (when "namespaced"), its own labels ("labels": what the
kustomize base gives it) over commonLabels and app.kubernetes.io/part-of, Helm's labels over
all (a managed-by or version the kustomize files spell is Helm's here), and commonAnnotations
with its own ("annotations"). "namespace" names the namespace (default: the release's).
  include "gpu-monitor.metadata" (dict "ctx" $ "name" "gpu-monitor" "namespaced" true "labels" (dict ...))
*/}}
{{- define "gpu-monitor.metadata" -}}
{{- $ctx := .ctx -}}
name: {{ .name }}
{{- if .namespaced }}
namespace: {{ .namespace | default (include "gpu-monitor.namespace" $ctx) }}
{{- end }}
{{- $labels := mergeOverwrite (dict) (deepCopy $ctx.Values.commonLabels) (dict "app.kubernetes.io/part-of" "gpu-monitor") (deepCopy (.labels | default dict)) (include "gpu-monitor.helmLabels" $ctx | fromYaml) }}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- $annotations := mergeOverwrite (dict) (deepCopy $ctx.Values.commonAnnotations) (.annotations | default dict) }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A pod template's labels: the selector labels ("labels"), commonLabels, podLabels and the
standard labels the kustomize base puts on pod templates (part-of, instance, version; not
managed-by or helm.sh/chart: the pods are the controllers' objects, not Helm's).
*/}}
{{- define "gpu-monitor.podLabels" -}}
{{- $ctx := .ctx -}}
{{- $standard := dict "app.kubernetes.io/part-of" "gpu-monitor" "app.kubernetes.io/instance" $ctx.Release.Name "app.kubernetes.io/version" ($ctx.Chart.AppVersion | toString) }}
{{- $labels := mergeOverwrite (dict) (deepCopy $ctx.Values.commonLabels) (deepCopy $ctx.Values.podLabels) (deepCopy .labels) $standard }}
{{- toYaml $labels }}
{{- end }}

{{/*
The image: repository@digest when a digest is given, else repository:tag (the tag defaults to
the chart's appVersion). (dict "ctx" $ "passive" true) appends passiveImage.tagSuffix to the tag.
*/}}
{{- define "gpu-monitor.image" -}}
{{- $image := .ctx.Values.image -}}
{{- $tag := $image.tag | default .ctx.Chart.AppVersion | toString -}}
{{- if .passive }}{{ $tag = printf "%s%s" $tag .ctx.Values.passiveImage.tagSuffix }}{{ end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}
{{- end }}

{{/*
Merge the map (index . 1) into the map (index . 0), in place: maps key by key, any other value
(false and 0 included, which sprig's mergeOverwrite would skip) replaces.
*/}}
{{- define "gpu-monitor.mergeInto" -}}
{{- $dst := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- $current := get $dst $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $current) -}}
{{- include "gpu-monitor.mergeInto" (list $current $value) -}}
{{- else -}}
{{- $_ := set $dst $key (deepCopy $value) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The daemon's configuration file: daemonset/config.yaml (through the link files/daemonset), with
remediation.dryRun, remediation.breaker.*, forceDelete.enabled and failfastDelete.enabled set in
it, then `config`
merged over it.
*/}}
{{- define "gpu-monitor.config" -}}
{{- $config := .Files.Get "files/daemonset/config.yaml" | fromYaml -}}
{{- if hasKey $config "Error" }}{{ fail (printf "files/daemonset/config.yaml: %s" $config.Error) }}{{ end -}}
{{- $remediation := $config.remediation -}}
{{- $_ := set $remediation "dry_run" .Values.remediation.dryRun -}}
{{- $_ := set $remediation.breaker "budget_fraction" .Values.remediation.breaker.budgetFraction -}}
{{- $_ := set $remediation.breaker "max_nodes" .Values.remediation.breaker.maxNodes -}}
{{- if .Values.forceDelete.enabled }}{{ $_ := set $remediation.drain "force_delete" true }}{{ end -}}
{{- if .Values.failfastDelete.enabled }}{{ $_ := set $config "failfast" (merge (dict "actions" (list "event" "file" "delete")) (default (dict) $config.failfast)) }}{{ end -}}
{{- if .Values.cleaning.enabled }}{{ $_ := set $config "cleaning" (merge (dict "enabled" true) (default (dict) $config.cleaning)) }}{{ end -}}
{{- include "gpu-monitor.mergeInto" (list $config .Values.config) -}}
# daemonset/config.yaml with the chart's values applied (values.yaml: remediation, forceDelete,
# failfastDelete, cleaning, config). Every key: docs/configuration.md.
{{ toYaml $config -}}
{{- end }}

{{/*
The objects of a manifest of the kustomize base (files/daemonset links to daemonset/), as the
kustomize base renders them for this release: an object or ServiceAccount subject the file puts
in gpu-monitor goes to this release's namespace (as kustomize's namespace transformer does),
one in gpu-monitor-jobs to fabric.jobNamespace.name, one in any other namespace stays there; the
labels of gpu-monitor.metadata are added. One source: objects no value changes are not written
twice. Parameters: "ctx", "file", optional "labels", "annotations" (added to every object),
"name" (the object's name instead of the file's; for one-object files), "rename" (file name ->
name), "omit" (file names left out), "fields" (file name -> top-level fields set on that
object, e.g. a PriorityClass's value) and "replace" (a list: old, new; a textual substitution
in the file first, for a namespace spelt inside a string).
  include "gpu-monitor.fileObjects" (dict "ctx" $ "file" "files/daemonset/role.yaml")
*/}}
{{- define "gpu-monitor.fileObjects" -}}
{{- $ctx := .ctx -}}
{{- $namespaces := dict "gpu-monitor" (include "gpu-monitor.namespace" $ctx) -}}
{{- if $ctx.Values.fabric.enabled }}{{ $_ := set $namespaces "gpu-monitor-jobs" (include "gpu-monitor.jobNamespace" $ctx) }}{{ end -}}
{{- $text := $ctx.Files.Get .file -}}
{{- if not $text }}{{ fail (printf "%s is missing or empty (files/daemonset must link to daemonset/)" .file) }}{{ end -}}
{{- with .replace }}{{ $text = replace (index . 0) (index . 1) $text }}{{ end -}}
{{- $params := . -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" $text -1 }}
{{- $object := fromYaml $doc }}
{{- if and $object (not (has ($object.metadata.name | default "") ($params.omit | default list))) }}
{{- if hasKey $object "Error" }}{{ fail (printf "%s: %s" $params.file $object.Error) }}{{ end }}
{{- $meta := $object.metadata }}
{{- $fileName := $meta.name }}
{{- $labels := mergeOverwrite (deepCopy ($meta.labels | default dict)) (deepCopy ($params.labels | default dict)) }}
{{- $annotations := mergeOverwrite (deepCopy ($meta.annotations | default dict)) (deepCopy ($params.annotations | default dict)) }}
{{- $own := get $namespaces ($meta.namespace | default "") | default $meta.namespace }}
{{- $name := $params.name | default (get ($params.rename | default dict) $fileName) | default $fileName }}
{{- $rendered := include "gpu-monitor.metadata" (dict "ctx" $ctx "name" $name "namespaced" (hasKey $meta "namespace") "namespace" $own "labels" $labels "annotations" $annotations) | fromYaml }}
{{- $_ := set $object "metadata" $rendered }}
{{- range $key, $value := get ($params.fields | default dict) $fileName | default dict }}{{ $_ := set $object $key $value }}{{ end }}
{{- range $subject := $object.subjects | default list }}
{{- if and (eq $subject.kind "ServiceAccount") $subject.namespace }}{{ $_ := set $subject "namespace" (get $namespaces ($subject.namespace | default "") | default $subject.namespace) }}{{ end }}
{{- end }}
---
{{ toYaml $object }}
{{- end }}
{{- end }}
{{- end }}

{{/* The fabric probe Job template: fabric.jobTemplate, else daemonset/fabric/job-template.yaml. */}}
{{- define "gpu-monitor.fabricJobTemplate" -}}
{{- .Values.fabric.jobTemplate | default (.Files.Get "files/daemonset/fabric/job-template.yaml") -}}
{{- end }}

{{/*
The fabric scheduler's settings file: daemonset/fabric/settings.yaml with fabric.probeResources,
fabric.activeCheckResources and fabric.activeCheckShmSize set in it, the Jobs' instance label
when the release is not named gpu-monitor, then fabric.settings merged over it (as `config`).
*/}}
{{- define "gpu-monitor.fabricSettings" -}}
{{- $settings := .Files.Get "files/daemonset/fabric/settings.yaml" | fromYaml -}}
{{- if hasKey $settings "Error" }}{{ fail (printf "files/daemonset/fabric/settings.yaml: %s" $settings.Error) }}{{ end -}}
{{- $fabric := .Values.fabric -}}
{{- $_ := set $settings "probe_resources" (deepCopy $fabric.probeResources) -}}
{{- $_ := set $settings "active_check_resources" (deepCopy $fabric.activeCheckResources) -}}
{{- $_ := set $settings "active_check_shm_size" $fabric.activeCheckShmSize -}}
{{- if ne .Release.Name "gpu-monitor" }}{{ $_ := set $settings "instance" .Release.Name }}{{ end -}}
{{- include "gpu-monitor.mergeInto" (list $settings $fabric.settings) -}}
# daemonset/fabric/settings.yaml with the chart's values applied (values.yaml: fabric). Every
# key: docs/fabric.md#settings; the scheduler's flags win over this file.
{{ toYaml $settings -}}
{{- end }}
