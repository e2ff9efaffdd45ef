{{/* Common labels. */}}
{{- define "spotguard.labels" -}}
app.kubernetes.io/part-of: spotguard
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Every namespaced object goes here: namespaceOverride, else the release namespace. */}}
{{- define "spotguard.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{/*
A function's values by its name (admission, spot-interruption, node-added):
the key admission, spotInterruption or nodeAdded, or an empty dict when the
key is absent. Call with (dict "name" NAME "root" $).
*/}}
{{- define "spotguard.component" -}}
{{- $key := index (dict "admission" "admission" "spot-interruption" "spotInterruption" "node-added" "nodeAdded") .name | default .name -}}
{{- toYaml (index .root.Values $key | default dict) -}}
{{- end -}}

{{/* A function's service account name: serviceAccount.name, else spotguard-<function>. */}}
{{- define "spotguard.serviceAccountName" -}}
{{- $c := include "spotguard.component" . | fromYaml -}}
{{- (($c.serviceAccount | default dict).name) | default (printf "spotguard-%s" .name) -}}
{{- end -}}

{{/*
The pod-level settings every component shares (values: serviceAccount,
podAnnotations, podLabels, affinity, topologySpreadConstraints,
priorityClassName, nodeSelector, tolerations). Call with
(dict "name" NAME "root" $ "values" $c "defaultAffinity" DICT
"defaultSpread" LIST); the defaults apply when the values leave them empty.
*/}}
{{- define "spotguard.podSpec" -}}
{{- $c := .values -}}
serviceAccountName: {{ include "spotguard.serviceAccountName" (dict "name" .name "root" .root) }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- with ($c.affinity | default .defaultAffinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.topologySpreadConstraints | default .defaultSpread) }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod labels: the selector labels, then podLabels (which cannot override them). */}}
{{- define "spotguard.podLabels" -}}
{{- $labels := merge (dict "app.kubernetes.io/name" (printf "spotguard-%s" .name) "app.kubernetes.io/component" .name "app.kubernetes.io/part-of" "spotguard" "app.kubernetes.io/instance" .root.Release.Name) (.values.podLabels | default dict) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* The container's securityContext: read-only root, no privileges. */}}
{{- define "spotguard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "spotguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The DNS names the API server uses for the webhook Service. */}}
{{- define "spotguard.admission.dnsNames" -}}
- spotguard-admission.{{ include "spotguard.namespace" . }}.svc
- spotguard-admission.{{ include "spotguard.namespace" . }}.svc.cluster.local
{{- end -}}

{{/* Role subjects: the function's service account, and its EKS group. */}}
{{- define "spotguard.subjects" -}}
- kind: ServiceAccount
  name: {{ include "spotguard.serviceAccountName" . }}
  namespace: {{ include "spotguard.namespace" .root }}
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
{{- $existing := lookup "v1" "Secret" (include "spotguard.namespace" .) "spotguard-admission-tls" -}}
{{- if and $existing (index ($existing.data | default dict) "ca.crt") -}}
{{- $result = dict "caCrt" (index $existing.data "ca.crt" | b64dec) "tlsCrt" (index $existing.data "tls.crt" | b64dec) "tlsKey" (index $existing.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $days := int .Values.certs.generate.days -}}
{{- $ca := genCA "spotguard webhook CA" $days -}}
{{- $names := list (printf "spotguard-admission.%s.svc" (include "spotguard.namespace" .)) (printf "spotguard-admission.%s.svc.cluster.local" (include "spotguard.namespace" .)) -}}
{{- $cert := genSignedCert (printf "spotguard-admission.%s.svc" (include "spotguard.namespace" .)) nil $names $days $ca -}}
{{- $result = dict "caCrt" $ca.Cert "tlsCrt" $cert.Cert "tlsKey" $cert.Key -}}
{{- end -}}
{{- /* Made once per render: the webhook's caBundle and the Secret must match. */ -}}
{{- $_ := set .Values "_spotguardGeneratedCerts" $result -}}
{{- end -}}
{{- toYaml (get .Values "_spotguardGeneratedCerts") -}}
{{- end -}}
