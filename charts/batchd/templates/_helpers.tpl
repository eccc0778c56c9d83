{{/* The chart's name, cut to 63 characters (Kubernetes label values). */}}
{{- define "batchd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name (fullnameOverride wins); the release name alone when it already contains the chart's. */}}
{{- define "batchd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "batchd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "batchd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "batchd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "batchd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: batchd
{{- end }}

{{- define "batchd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "batchd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "batchd.image" -}}
{{- printf "%s:%s" .repository (default .appVersion .tag) }}
{{- end }}

{{/* Whether to create Prometheus Operator monitors: forced by monitoring.enabled, else when the API exists. */}}
{{- define "batchd.monitors" -}}
{{- if kindIs "invalid" .Values.monitoring.enabled }}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- else if .Values.monitoring.enabled }}true{{ end }}
{{- end }}

{{/*
Exactly the API calls the operator makes (tests/charts/test_rbac.py compares them with the
calls recorded in the operator's end-to-end tests): nothing more.
*/}}
{{- define "batchd.rbacRules" -}}
- apiGroups: ["serving.batchd.dev"]
  resources: ["batcheddeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["serving.batchd.dev"]
  resources: ["batcheddeployments/status"]
  verbs: ["patch"]
# delete: a canary revision's Deployment, Service and ConfigMap when its rollout ends.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# get: the access Secret's signing key read back before each apply (never made twice), and the
# users' API keys Secrets its digests are made from; list/watch: a key added or removed reaches
# the access Secret within seconds.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The ServiceAccount each deployment's replicas run as (the identity of their composed calls).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
# delete: a canary's policy when its rollout ends, every policy when networkPolicy.enabled is off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
{{- end }}

{{/* The router's resources: the release's full name with a -router suffix, cut to 63 characters. */}}
{{- define "batchd.routerFullname" -}}
{{- printf "%s-router" (include "batchd.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* The router pods' selector; the operator finds them by these labels (BATCHD_ROUTER_SELECTOR). */}}
{{- define "batchd.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "batchd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{- define "batchd.routerLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "batchd.routerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: batchd
{{- end }}

{{/* The URL clients and composing replicas call: the router's Service. */}}
{{- define "batchd.routerUrl" -}}
{{- printf "http://%s.%s.svc" (include "batchd.routerFullname" .) .Release.Namespace }}
{{- end }}

{{/* The router's own (Cluster)Role rules: exactly batchd.router.rbac.RULES (tests/charts/test_router.py). */}}
{{- define "batchd.routerRbacRules" -}}
- apiGroups: ["serving.batchd.dev"]
  resources: ["batcheddeployments"]
  verbs: ["list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["list", "watch"]
{{- end }}

{{/* The `<release>-invoker` role: the verb a caller's ServiceAccount needs on a BatchedDeployment. */}}
{{- define "batchd.invokerRules" -}}
- apiGroups: ["serving.batchd.dev"]
  resources: ["batcheddeployments"]
  verbs: ["invoke"]
{{- end }}

{{- define "batchd.invokerLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "batchd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: invoker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: batchd
{{- end }}

{{/* Whether the operator needs a Role to list the router pods: only when it watches listed
namespaces and the release's is not among them (a ClusterRole or a watched namespace already
lets it list pods there). */}}
{{- /* The release's own namespace is not among those watched: the operator's read of the routers'
pods and the routers' read of their own Service's endpoints need a Role of their own there. */}}
{{- define "batchd.releaseNamespaceUnwatched" -}}
{{- if and .Values.router.enabled .Values.rbac.create .Values.watchNamespaces (not (has .Release.Namespace .Values.watchNamespaces)) }}true{{ end }}
{{- end }}

{{/*
The standard OpenTelemetry environment of a pod that traces (batchd.api.tracing_config renders the same
for replica pods; tests/charts compare the two): `serviceName` names it, `component` its
container; the pod's own facts come from the downward API. Nothing without tracing.endpoint.
*/}}
{{- define "batchd.tracingEnv" -}}
{{- with .root.Values.tracing }}
{{- if .endpoint }}
- name: OTEL_SERVICE_NAME
  value: {{ $.serviceName | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ trimSuffix "/" .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: "http/protobuf"
- name: OTEL_TRACES_EXPORTER
  value: "otlp"
- name: OTEL_TRACES_SAMPLER
  value: "parentbased_traceidratio"
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplingRatio | toString | quote }}
- name: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
  value: "false"
- name: OTEL_RESOURCE_ATTRIBUTES_POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: OTEL_RESOURCE_ATTRIBUTES_POD_UID
  valueFrom: {fieldRef: {fieldPath: metadata.uid}}
- name: OTEL_RESOURCE_ATTRIBUTES_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: OTEL_RESOURCE_ATTRIBUTES_NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.pod.name=$(OTEL_RESOURCE_ATTRIBUTES_POD_NAME),k8s.pod.uid=$(OTEL_RESOURCE_ATTRIBUTES_POD_UID),k8s.namespace.name=$(OTEL_RESOURCE_ATTRIBUTES_NAMESPACE),k8s.node.name=$(OTEL_RESOURCE_ATTRIBUTES_NODE_NAME),k8s.deployment.name=%s,k8s.container.name=%s,service.version=%s" $.deployment $.component $.root.Chart.AppVersion | quote }}
{{- end }}
{{- end }}
{{- end }}
