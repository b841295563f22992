{{/* The chart's name, at most 63 characters (a label value). */}}
{{- define "meshbridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: the release name when it already holds the chart's name
(release `meshbridge` gives `meshbridge`, the kustomization's names), else
RELEASE-meshbridge.
*/}}
{{- define "meshbridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "meshbridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshbridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "meshbridge.labels" -}}
{{ include "meshbridge.selectorLabels" . }}
app.kubernetes.io/part-of: meshbridge
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "meshbridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meshbridge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: the ServiceAccount to run as, when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the admin token: yours, or the chart's FULLNAME-admin. */}}
{{- define "meshbridge.adminSecretName" -}}
{{- default (printf "%s-admin" (include "meshbridge.fullname" .)) .Values.adminToken.existingSecret }}
{{- end }}

{{/* `meshbridge run` and its flags, as in deploy/kubernetes/deployment.yaml. */}}
{{- define "meshbridge.args" -}}
{{- $args := list "run" "--kube" "--namespace" .Values.mcpBridgeNamespace }}
{{- with .Values.watchNamespace }}
{{- $args = concat $args (list "--watch-namespace" .) }}
{{- end }}
{{- $le := .Values.leaderElection }}
{{- if $le.enabled }}
{{- $args = append $args "--leader-elect" }}
{{- if ne $le.lease "meshbridge" }}
{{- $args = concat $args (list "--leader-lease" $le.lease) }}
{{- end }}
{{- with $le.leaseDuration }}
{{- $args = concat $args (list "--leader-lease-duration" .) }}
{{- end }}
{{- with $le.renewDeadline }}
{{- $args = concat $args (list "--leader-renew-deadline" .) }}
{{- end }}
{{- with $le.retryPeriod }}
{{- $args = concat $args (list "--leader-retry-period" .) }}
{{- end }}
{{- else }}
{{- $args = append $args "--leader-elect=false" }}
{{- end }}
{{- concat $args .Values.extraArgs | toJson }}
{{- end }}
