{{/* Common labels. */}}
{{- define "spotguard.labels" -}}
app.kubernetes.io/part-of: spotguard
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "spotguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The DNS names the API server uses for the webhook Service. */}}
{{- define "spotguard.admission.dnsNames" -}}
- spotguard-admission.{{ .Values.namespace }}.svc
- spotguard-admission.{{ .Values.namespace }}.svc.cluster.local
{{- end -}}

{{/* Role subjects: the function's service account, and its EKS group. */}}
{{- define "spotguard.subjects" -}}
- kind: ServiceAccount
  name: spotguard-{{ .name }}
  namespace: {{ .root.Values.namespace }}
{{- if .root.Values.rbac.eksGroups }}
- kind: Group
  apiGroup: rbac.authorization.k8s.io
  name: spotguard:{{ .name }}
{{- end }}
{{- end -}}

{{/*
The serving certificate for certs.mode=generate: reuse the one in the cluster
(so upgrades keep it), else make a new CA and certificate.
Returns a dict with caCrt, tlsCrt, tlsKey (PEM).
*/}}
{{- define "spotguard.generatedCerts" -}}
{{- if not (hasKey .Values "_spotguardGeneratedCerts") -}}
{{- $result := dict -}}
{{- $existing := lookup "v1" "Secret" .Values.namespace "spotguard-admission-tls" -}}
{{- if and $existing (index ($existing.data | default dict) "ca.crt") -}}
{{- $result = dict "caCrt" (index $existing.data "ca.crt" | b64dec) "tlsCrt" (index $existing.data "tls.crt" | b64dec) "tlsKey" (index $existing.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $days := int .Values.certs.generate.days -}}
{{- $ca := genCA "spotguard webhook CA" $days -}}
{{- $names := list (printf "spotguard-admission.%s.svc" .Values.namespace) (printf "spotguard-admission.%s.svc.cluster.local" .Values.namespace) -}}
{{- $cert := genSignedCert (printf "spotguard-admission.%s.svc" .Values.namespace) nil $names $days $ca -}}
{{- $result = dict "caCrt" $ca.Cert "tlsCrt" $cert.Cert "tlsKey" $cert.Key -}}
{{- end -}}
{{- /* Made once per render: the webhook's caBundle and the Secret must match. */ -}}
{{- $_ := set .Values "_spotguardGeneratedCerts" $result -}}
{{- end -}}
{{- toYaml (get .Values "_spotguardGeneratedCerts") -}}
{{- end -}}
