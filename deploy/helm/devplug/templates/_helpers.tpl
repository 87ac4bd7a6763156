{{- define "devplug.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "devplug.labels" -}}
app.kubernetes.io/name: devplug
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "devplug.selector" -}}
app.kubernetes.io/name: devplug
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
