{{/* The labels of every object: the name the DaemonSet selects by, and Helm's own. */}}
{{- define "dra-gatekeeper.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "dra-gatekeeper.labels" -}}
app.kubernetes.io/name: dra-gatekeeper
{{ include "dra-gatekeeper.helmLabels" . }}
{{- end }}

{{- define "dra-gatekeeper.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "dra-gatekeeper.policyConfigMap" -}}
{{ .Values.existingPolicyConfigMap | default (printf "%s-policy" .Values.name) }}
{{- end }}

{{/*
Fail closed: the generated objects must be the ones `dra-gatekeeper policy deploy` made for this
policy and this ServiceAccount, or the RBAC, the admission policy and APF would hold another
gatekeeper (or another policy) than the one this release runs.
*/}}
{{- define "dra-gatekeeper.checkGenerated" -}}
{{- $gen := .Values.generated | default dict }}
{{- if not $gen.objects }}
{{- fail "values: `generated` is empty: make it with `dra-gatekeeper policy deploy --policy FILE --service-account NAMESPACE/NAME --format helm-values` and pass it with -f" }}
{{- end }}
{{- $account := printf "%s/%s" .Release.Namespace .Values.name }}
{{- if ne $gen.serviceAccount $account }}
{{- fail (printf "values: `generated` was made for the ServiceAccount %s, this release runs %s: regenerate with --service-account %s (or install into that namespace)" $gen.serviceAccount $account $account) }}
{{- end }}
{{- if ne (sha256sum (.Values.policy | default "")) $gen.policySHA256 }}
{{- fail "values: `policy` is not the policy `generated` was made from: pass the values file `dra-gatekeeper policy deploy --format helm-values` printed for it, unchanged" }}
{{- end }}
{{- end }}
