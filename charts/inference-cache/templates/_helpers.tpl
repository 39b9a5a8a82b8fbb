{{/*
Names. The Services carry the DNS names the binaries use by default
(inferencecache-index-server.<namespace>:9090 and :8081, ...), so every
object name is fixed rather than derived from the release name: one
InferenceCache per cluster (its webhook configurations are cluster-wide).
*/}}
{{- define "ic.name.controller" -}}inferencecache-controller{{- end -}}
{{- define "ic.name.webhook" -}}inferencecache-webhook{{- end -}}
{{- define "ic.name.indexServer" -}}inferencecache-index-server{{- end -}}
{{- define "ic.name.coordinator" -}}inferencecache-coordinator{{- end -}}

{{- define "ic.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" . "component" "controller"). */}}
{{- define "ic.selectorLabels" -}}
app.kubernetes.io/name: inference-cache
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every label of one component's objects. */}}
{{- define "ic.labels" -}}
{{ include "ic.selectorLabels" . }}
app.kubernetes.io/part-of: inference-cache
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "ic.chart" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The registry every image comes from: global.imageRegistry wins over image.registry. */}}
{{- define "ic.registry" -}}
{{- $global := (.Values.global | default dict).imageRegistry | default "" -}}
{{- $global | default .Values.image.registry | trimSuffix "/" -}}
{{- end -}}

{{/* Image reference: (dict "ctx" . "image" .Values.controller.image). */}}
{{- define "ic.image" -}}
{{- $registry := include "ic.registry" .ctx -}}
{{- $name := .image.name -}}
{{- $ref := ternary $name (printf "%s/%s" $registry $name) (empty $registry) -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $ref .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (.image.tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
Names of the pull secrets: global.imagePullSecrets then imagePullSecrets,
each a name or {name: ...}, without repeats; one per line.
*/}}
{{- define "ic.pullSecretNames" -}}
{{- $all := concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- $names := list -}}
{{- range $all -}}
{{- if kindIs "map" . -}}
{{- $names = append $names .name -}}
{{- else -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- range uniq $names }}
{{ . }}
{{- end -}}
{{- end -}}

{{/* The subscriber image the webhook injects (empty when disabled). */}}
{{- define "ic.subscriberImage" -}}
{{- if .Values.subscriber.enabled -}}
{{ include "ic.image" (dict "ctx" . "image" .Values.subscriber.image) }}
{{- end -}}
{{- end -}}

{{/* In-cluster URLs of the index server and the coordinator. */}}
{{- define "ic.url.indexGrpc" -}}
{{ ternary "https" "http" (eq (include "ic.indexTls" .) "true") }}://{{ include "ic.name.indexServer" . }}.{{ .Release.Namespace }}:9090
{{- end -}}

{{/*
The headless Service the subscribers resolve to reach every index-server
replica (the webhook injects it with --index-server-discovery=dns).
*/}}
{{- define "ic.url.indexGrpcHeadless" -}}
{{ ternary "https" "http" (eq (include "ic.indexTls" .) "true") }}://{{ include "ic.name.indexServer" . }}-headless.{{ .Release.Namespace }}:9090
{{- end -}}

{{/*
The names the index server's certificate carries: its Service (gateways,
the controller) and its headless Service (subscribers verify each replica
against that name), short and qualified.
*/}}
{{- define "ic.indexServerDnsNames" -}}
{{- $name := include "ic.name.indexServer" . -}}
{{- range $svc := list $name (printf "%s-headless" $name) }}
- {{ $svc }}.{{ $.Release.Namespace }}
- {{ $svc }}.{{ $.Release.Namespace }}.svc
- {{ $svc }}.{{ $.Release.Namespace }}.svc.{{ $.Values.clusterDomain }}
{{- end }}
{{- end -}}

{{/* "true" when the index server's gRPC ports serve TLS. */}}
{{- define "ic.indexTls" -}}
{{- ne .Values.indexServer.tls.mode "disabled" -}}
{{- end -}}

{{/*
The client side of the index server's TLS: a volume holding only the ca.crt
of its Secret (never the key), and where it is mounted.
*/}}
{{- define "ic.indexCaVolume" -}}
- name: index-server-ca
  secret:
    secretName: {{ .Values.indexServer.tls.secretName }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end -}}
{{- define "ic.indexCaMount" -}}
- name: index-server-ca
  mountPath: /index-server-ca
  readOnly: true
{{- end -}}
{{- define "ic.indexCaFile" -}}/index-server-ca/ca.crt{{- end -}}
{{- define "ic.url.indexHttp" -}}
http://{{ include "ic.name.indexServer" . }}.{{ .Release.Namespace }}:8081
{{- end -}}
{{- define "ic.url.coordinator" -}}
http://{{ include "ic.name.coordinator" . }}.{{ .Release.Namespace }}:9300
{{- end -}}

{{/* The pod's imagePullSecrets field (nothing when there are none). */}}
{{- define "ic.pullSecrets" -}}
{{- with include "ic.pullSecretNames" . | trim }}
imagePullSecrets:
  {{- range splitList "\n" . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
A container's args: the chart's flags (a list of "--flag=value" or
"--flag"), each left out when extraArgs names the same flag, then
extraArgs. A user can so override any flag the chart sets (clap refuses a
repeated one). (dict "args" (list ...) "extra" $v.extraArgs)
*/}}
{{- define "ic.args" -}}
{{- $named := dict -}}
{{- range .extra -}}
{{- $flag := regexReplaceAll "=.*$" (toString .) "" -}}
{{- if hasPrefix "--" $flag -}}
{{- $_ := set $named $flag true -}}
{{- end -}}
{{- end -}}
{{- range .args }}
{{- if not (hasKey $named (regexReplaceAll "=.*$" (toString .) "")) }}
- {{ toJson (toString .) }}
{{- end }}
{{- end }}
{{- range .extra }}
- {{ toJson (toString .) }}
{{- end }}
{{- end -}}

{{/* Pod-level fields every pod of the chart shares: (dict "ctx" . "values" .Values.controller). */}}
{{- define "ic.podCommon" -}}
{{- include "ic.pullSecrets" .ctx }}
securityContext:
  {{- toYaml .ctx.Values.pods.securityContext | nindent 2 }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with merge (deepCopy (.values.nodeSelector | default dict)) (.ctx.Values.pods.nodeSelector | default dict) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Topology spread of a component that may run several replicas: the
configured constraints, or by default across nodes and zones (best
effort). Rendered at any replica count, so `kubectl scale` or an HPA keeps
the spread and going from one replica to two leaves the pod template (and
the running pod) alone.
(dict "ctx" . "values" .Values.webhook "component" "webhook")
*/}}
{{- define "ic.topologySpread" -}}
{{- if true }}
topologySpreadConstraints:
{{- if .values.topologySpreadConstraints }}
  {{- toYaml .values.topologySpreadConstraints | nindent 2 }}
{{- else }}
  {{- range list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
  - maxSkew: 1
    topologyKey: {{ . }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "ic.selectorLabels" (dict "ctx" $.ctx "component" $.component) | nindent 8 }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The flags every binary takes. */}}
{{- define "ic.logArgs" -}}
- --log-level={{ .Values.pods.logLevel }}
- --log-format={{ .Values.pods.logFormat }}
{{- with .Values.otlp.endpoint }}
- --otlp-endpoint={{ . }}
- --otlp-export-interval-seconds={{ $.Values.otlp.exportIntervalSeconds }}
- --otlp-trace-ratio={{ $.Values.otlp.traceRatio }}
{{- end }}
{{- end -}}

{{/*
Liveness and readiness on an admin port name, with the component's
livenessProbe / readinessProbe values merged over them:
(dict "port" "admin" "values" $v).
*/}}
{{- define "ic.probes" -}}
{{- $live := dict "httpGet" (dict "path" "/live" "port" .port) "periodSeconds" 10 "timeoutSeconds" 3 "failureThreshold" 3 -}}
{{- $ready := dict "httpGet" (dict "path" "/ready" "port" .port) "periodSeconds" 5 "timeoutSeconds" 3 "failureThreshold" 2 -}}
livenessProbe:
  {{- toYaml (mergeOverwrite $live (deepCopy (.values.livenessProbe | default dict))) | nindent 2 }}
readinessProbe:
  {{- toYaml (mergeOverwrite $ready (deepCopy (.values.readinessProbe | default dict))) | nindent 2 }}
{{- end -}}

{{/* Whether a monitoring object renders: (dict "ctx" . "values" .Values.monitoring.serviceMonitors "api" "monitoring.coreos.com/v1/ServiceMonitor"). */}}
{{- define "ic.monitoringEnabled" -}}
{{- if and .values.enabled (or .values.force (.ctx.Capabilities.APIVersions.Has .api)) -}}
true
{{- end -}}
{{- end -}}
