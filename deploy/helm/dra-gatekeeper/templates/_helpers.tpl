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

{{/* The signerName the gatekeepers ask: the signer's own, or cert-manager's for its issuer. */}}
{{- define "dra-gatekeeper.signerName" -}}
{{- if .Values.certManager.enabled }}
{{- $issuer := .Values.certManager.issuer }}
{{- if not $issuer.name }}
{{- fail "values: certManager.enabled needs certManager.issuer.name" }}
{{- end }}
{{- if eq $issuer.kind "Issuer" }}
{{- if not $issuer.namespace }}
{{- fail "values: certManager.issuer.kind Issuer needs certManager.issuer.namespace" }}
{{- end }}
{{- printf "issuers.cert-manager.io/%s.%s" $issuer.namespace $issuer.name }}
{{- else }}
{{- printf "clusterissuers.cert-manager.io/%s" $issuer.name }}
{{- end }}
{{- else }}
{{- .Values.signer.signerName }}
{{- end }}
{{- end }}

{{/* The ConfigMap of the release's namespace publish-ca reads the CA certificates from. */}}
{{- define "dra-gatekeeper.caCertificates" -}}
{{- if .Values.certManager.enabled }}{{ .Values.certManager.caConfigMap }}{{ else }}{{ printf "%s-ca-certificates" .Values.name }}{{ end }}
{{- end }}

{{/*
Fail closed: the generated objects must be the ones `dra-gatekeeper policy deploy` made for this
policy and this ServiceAccount, or the RBAC, the admission policy and APF would hold another
gatekeeper (or another policy) than the one this release runs. They are made for the release's
namespace, whatever it is: `generated` names it dra-gatekeeper-release-namespace, replaced here.
*/}}
{{- define "dra-gatekeeper.checkGenerated" -}}
{{- $gen := .Values.generated | default dict }}
{{- if not $gen.objects }}
{{- fail "values: `generated` is empty: make it with `dra-gatekeeper policy deploy --policy FILE --service-account NAMESPACE/NAME --format helm-values` and pass it with -f" }}
{{- end }}
{{- if ne $gen.serviceAccount .Values.name }}
{{- fail (printf "values: `generated` was made for the ServiceAccount %s, this release runs %s: regenerate with --service-account NAMESPACE/%s (or set name: %s)" $gen.serviceAccount .Values.name .Values.name $gen.serviceAccount) }}
{{- end }}
{{- if ne (sha256sum (.Values.policy | default "")) $gen.policySHA256 }}
{{- fail "values: `policy` is not the policy `generated` was made from: pass the values file `dra-gatekeeper policy deploy --format helm-values` printed for it, unchanged" }}
{{- end }}
{{- end }}
