{{/*
metadata.annotations and metadata.labels of every CRD (crdgen puts this
include under each CRD's metadata.name).
*/}}
{{- define "inference-cache-crds.metadata" -}}
{{- if .Values.keep -}}
annotations:
  # Uninstalling the chart must never delete the CRDs: that would delete every
  # CacheBackend, CachePolicy, CacheTenant and CacheIndex with them.
  helm.sh/resource-policy: keep
{{ end -}}
labels:
  app.kubernetes.io/name: inference-cache
  app.kubernetes.io/part-of: inference-cache
  app.kubernetes.io/component: crds
  app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
  app.kubernetes.io/managed-by: {{ .Release.Service }}
  helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
  {{- with .Values.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
