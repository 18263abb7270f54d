{{/* The name of every object: the release's. */}}
{{- define "vramguard.name" -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* What the DaemonSet selects its pods by. */}}
{{- define "vramguard.selectorLabels" -}}
app.kubernetes.io/name: vramguard
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vramguard.labels" -}}
{{ include "vramguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- if .Values.helmLabels }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- end -}}

{{- define "vramguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
