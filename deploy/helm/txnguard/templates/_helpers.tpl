{{- define "txnguard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "txnguard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.shape }}
{{- end -}}

{{- define "txnguard.labels" -}}
{{ include "txnguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "txnguard.headless" -}}{{ include "txnguard.fullname" . }}-brokers{{- end -}}

{{/* Prometheus' kubernetes_sd "prometheus.io/*" convention; the admin port serves /metrics. */}}
{{- define "txnguard.podAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.adminPort | quote }}
prometheus.io/path: /metrics
checksum/config: {{ include "txnguard.config" . | sha256sum }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The proxy's configuration file: the shape's listeners and upstream, then the operator's settings. */}}
{{- define "txnguard.config" -}}
{{- $shape := dict -}}
{{- if eq .Values.shape "gateway" -}}
{{- $shape = dict "mode" "gateway" "listen" (printf "0.0.0.0:%d" (int .Values.gateway.port)) "advertised_host" .Values.gateway.advertisedHost "broker_port_base" .Values.gateway.brokerPortBase "upstream" .Values.gateway.upstream -}}
{{- else if eq .Values.shape "sidecar-container" -}}
{{- $shape = dict "mode" "sidecar" "listen" (printf "0.0.0.0:%d" (int .Values.sidecarContainer.clientPort)) "upstream" (list (printf "127.0.0.1:%d" (int .Values.sidecarContainer.brokerLocalPort))) -}}
{{- else -}}
{{- $shape = dict "mode" "sidecar" "listen" (printf "0.0.0.0:%d" (int .Values.sidecar.clientPort)) "upstream" (list (printf "127.0.0.1:%d" (int .Values.sidecar.brokerLocalPort))) -}}
{{- end -}}
{{- $_ := set $shape "admin" (printf "0.0.0.0:%d" (int .Values.adminPort)) -}}
{{- if and (eq .Values.shape "gateway") (include "txnguard.spreadReplicas" .) (kindIs "invalid" (dig "verification" "evidence_ttl_ms" nil .Values.config)) -}}
{{- /* Replicas without ClientIP affinity: a client's EndTxn may go through another replica, so no replica reuses
       what it saw (evidence_ttl_ms 0); every transactional write is checked against the coordinator's log the
       replica follows, in memory (gateway.yaml refuses this without the log). */ -}}
{{- $_ := set $shape "verification" (dict "evidence_ttl_ms" 0) -}}
{{- end -}}
{{- toYaml (mergeOverwrite (deepCopy .Values.config) $shape) -}}
{{- end -}}

{{/* The txnguard container, the same in every shape. Added to someone else's pod (sidecar-container) its ports
     are named txnguard and txnguard-admin, names a broker container is unlikely to use already. */}}
{{- define "txnguard.container" -}}
{{- $admin := ternary "txnguard-admin" "admin" (eq .Values.shape "sidecar-container") -}}
- name: txnguard
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["--config", "/etc/txnguard/txnguard.yaml"]
  ports:
  {{- if eq .Values.shape "gateway" }}
    - {name: kafka, containerPort: {{ .Values.gateway.port }}}
    {{- range .Values.gateway.brokerIds }}
    - {name: broker-{{ . }}, containerPort: {{ add $.Values.gateway.brokerPortBase . }}}
    {{- end }}
  {{- else if eq .Values.shape "sidecar-container" }}
    - {name: txnguard, containerPort: {{ .Values.sidecarContainer.clientPort }}}
  {{- else }}
    - {name: kafka, containerPort: {{ .Values.sidecar.clientPort }}}
  {{- end }}
    - {name: {{ $admin }}, containerPort: {{ .Values.adminPort }}}
  # /livez: the event loop answers. /readyz: the proxy's own Metadata request succeeded recently, so a
  # proxy that cannot reach its brokers leaves the Service until it can.
  livenessProbe:
    httpGet: {path: /livez, port: {{ $admin }}}
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    httpGet: {path: /readyz, port: {{ $admin }}}
    periodSeconds: 5
    failureThreshold: 2
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  volumeMounts:
    - {name: txnguard-config, mountPath: /etc/txnguard, readOnly: true}
    - {name: txnguard-audit, mountPath: /var/log/txnguard}
{{- end -}}

{{- define "txnguard.volumes" -}}
- name: txnguard-config
  configMap: {name: {{ include "txnguard.fullname" . }}}
- name: txnguard-audit
  emptyDir: {}
{{- end -}}

{{/* "true" when a gateway runs several replicas without ClientIP affinity, else "". */}}
{{- define "txnguard.spreadReplicas" -}}
{{- if and (gt (int .Values.gateway.replicas) 1) (ne .Values.gateway.service.sessionAffinity "ClientIP") -}}true{{- end -}}
{{- end -}}
