{{/*
The prefix of every object's name: fullnameOverride, else nameOverride, else
"spotguard" (whatever the release is called, so that names stay what earlier
versions of the chart made and what infra/kubernetes uses); at most 36
characters (the longest suffix, -spot-interruption-metrics, keeps names within
63). Two releases in one cluster need different prefixes: the webhook
configurations and ClusterRoles are cluster-wide.
*/}}
{{- define "spotguard.fullname" -}}
{{- .Values.fullnameOverride | default .Values.nameOverride | default .Chart.Name | trunc 36 | trimSuffix "-" -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "spotguard.labels" -}}
app.kubernetes.io/part-of: spotguard
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
A component's object labels: the common labels, its name and component.
Call with (dict "name" NAME "root" $).
*/}}
{{- define "spotguard.componentLabels" -}}
{{ include "spotguard.labels" .root }}
app.kubernetes.io/name: {{ include "spotguard.fullname" .root }}-{{ .name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{/*
The plain-HTTP /metrics Service of spot-interruption or node-added, for the
ServiceMonitor (which selects Services labelled spotguard.io/metrics).
Call with (dict "name" NAME "root" $ "port" PORT).
*/}}
{{- define "spotguard.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "spotguard.fullname" .root }}-{{ .name }}-metrics
  namespace: {{ include "spotguard.namespace" .root }}
  labels:
    {{- include "spotguard.componentLabels" . | nindent 4 }}
    spotguard.io/metrics: "true"
spec:
  selector:
    app.kubernetes.io/name: {{ include "spotguard.fullname" .root }}-{{ .name }}
  ports:
    - name: metrics
      port: {{ .port }}
      targetPort: metrics
      protocol: TCP
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

{{/* A function's service account name: serviceAccount.name, else <fullname>-<function>. */}}
{{- define "spotguard.serviceAccountName" -}}
{{- $c := include "spotguard.component" . | fromYaml -}}
{{- (($c.serviceAccount | default dict).name) | default (printf "%s-%s" (include "spotguard.fullname" .root) .name) -}}
{{- end -}}

{{/*
The pod-level settings every component shares (values: serviceAccount,
podAnnotations, podLabels, affinity, topologySpreadConstraints,
priorityClassName, nodeSelector, tolerations). Call with
(dict "name" NAME "root" $ "values" $c "spreadKeys" LIST). Where the values
leave them empty: the affinity prefers nodes that are not spot
(onDemandAffinity), and the pods spread over each topology key of spreadKeys
(none by default).
*/}}
{{- define "spotguard.podSpec" -}}
{{- $c := .values -}}
{{- $selector := dict "app.kubernetes.io/name" (printf "%s-%s" (include "spotguard.fullname" .root) .name) -}}
{{- $affinity := dict -}}
{{- if $c.onDemandAffinity.enabled -}}
{{- $terms := list -}}
{{- range $e := $c.onDemandAffinity.notSpot -}}
{{- $terms = append $terms (dict "key" $e.key "operator" "NotIn" "values" $e.values) -}}
{{- end -}}
{{- $affinity = dict "nodeAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "preference" (dict "matchExpressions" $terms)))) -}}
{{- end -}}
{{- $spread := list -}}
{{- range $key := .spreadKeys | default list -}}
{{- $spread = append $spread (dict "maxSkew" 1 "topologyKey" $key "whenUnsatisfiable" "ScheduleAnyway" "labelSelector" (dict "matchLabels" $selector)) -}}
{{- end -}}
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
{{- with ($c.affinity | default $affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.topologySpreadConstraints | default $spread) }}
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
{{- $labels := merge (dict "app.kubernetes.io/name" (printf "%s-%s" (include "spotguard.fullname" .root) .name) "app.kubernetes.io/component" .name "app.kubernetes.io/part-of" "spotguard" "app.kubernetes.io/instance" .root.Release.Name) (.values.podLabels | default dict) -}}
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

{{/* repository@digest where image.digest is set, else repository:tag (default appVersion). */}}
{{- define "spotguard.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The namespaces spotguard never touches: its own, then excludedNamespaces. */}}
{{- define "spotguard.excludedNamespaces" -}}
{{- toYaml (concat (list (include "spotguard.namespace" .)) .Values.excludedNamespaces | uniq) -}}
{{- end -}}

{{/*
Every container's env: where its settings are (SPOTGUARD_NAMESPACE,
SPOTGUARD_CONFIGMAP), then the component's extraEnv. Call with
(dict "root" $ "values" $c).
*/}}
{{- define "spotguard.env" -}}
- name: SPOTGUARD_NAMESPACE
  value: {{ include "spotguard.namespace" .root | quote }}
- name: SPOTGUARD_CONFIGMAP
  value: {{ printf "%s-config" (include "spotguard.fullname" .root) | quote }}
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The DNS names the API server uses for the webhook Service. */}}
{{- define "spotguard.admission.dnsNames" -}}
- {{ include "spotguard.fullname" . }}-admission.{{ include "spotguard.namespace" . }}.svc
- {{ include "spotguard.fullname" . }}-admission.{{ include "spotguard.namespace" . }}.svc.cluster.local
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
{{- /* lookup answers nothing without a cluster (helm template, helm lint, Argo CD,
     --dry-run=client): kube-system always exists in a cluster, so its absence says
     this render cannot see the Secret it would keep, and would make a new CA. */ -}}
{{- if and (not (lookup "v1" "Namespace" "" "kube-system")) (not .Values.certs.generate.renderWithoutCluster) -}}
{{- fail "certs.mode=generate needs the cluster (helm install or helm upgrade): this render cannot see it (helm template, Argo CD, --dry-run=client), so it would make a new CA every time, the diff would never clear and the webhook's caBundle would change before its pods see the new Secret. Use certs.mode=cert-manager (or static) with GitOps; certs.generate.renderWithoutCluster=true only to lint." -}}
{{- end -}}
{{- $result := dict -}}
{{- $existing := lookup "v1" "Secret" (include "spotguard.namespace" .) (printf "%s-admission-tls" (include "spotguard.fullname" .)) -}}
{{- if and $existing (index ($existing.data | default dict) "ca.crt") -}}
{{- $result = dict "caCrt" (index $existing.data "ca.crt" | b64dec) "tlsCrt" (index $existing.data "tls.crt" | b64dec) "tlsKey" (index $existing.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $days := int .Values.certs.generate.days -}}
{{- $ca := genCA "spotguard webhook CA" $days -}}
{{- $service := printf "%s-admission.%s.svc" (include "spotguard.fullname" .) (include "spotguard.namespace" .) -}}
{{- $names := list $service (printf "%s.cluster.local" $service) -}}
{{- $cert := genSignedCert $service nil $names $days $ca -}}
{{- $result = dict "caCrt" $ca.Cert "tlsCrt" $cert.Cert "tlsKey" $cert.Key -}}
{{- end -}}
{{- /* Made once per render: the webhook's caBundle and the Secret must match. */ -}}
{{- $_ := set .Values "_spotguardGeneratedCerts" $result -}}
{{- end -}}
{{- toYaml (get .Values "_spotguardGeneratedCerts") -}}
{{- end -}}
