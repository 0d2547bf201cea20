{{/* Names, labels and the pieces every workload shares. */}}

{{- define "nodeward.labels" -}}
app.kubernetes.io/part-of: nodeward
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* selector labels of one component: (dict "ctx" $ "component" "cordon") */}}
{{- define "nodeward.selector" -}}
app.kubernetes.io/name: nodeward
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* the selector's labels but instance, for objects that also carry nodeward.labels */}}
{{- define "nodeward.componentLabels" -}}
app.kubernetes.io/name: nodeward
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "nodeward.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The NATS URL: bus.url, else the NATS subchart's client Service. */}}
{{- define "nodeward.natsUrl" -}}
{{- if .Values.bus.url -}}
{{ .Values.bus.url }}
{{- else -}}
{{- $svc := ternary .Release.Name (printf "%s-nats" .Release.Name) (contains "nats" .Release.Name) -}}
nats://{{ $svc | trunc 63 | trimSuffix "-" }}.{{ .Release.Namespace }}.svc:4222
{{- end -}}
{{- end -}}

{{/* A node name as one NATS subject token (schemas.tokens.token). */}}
{{- define "nodeward.token" -}}
{{- regexReplaceAll "[^A-Za-z0-9_\\-:@+=~]" . "_" -}}
{{- end -}}

{{- define "nodeward.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "nodeward.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Probes on the daemon's own port (the port's name): liveness /healthz, readiness /readyz. */}}
{{- define "nodeward.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: {{ . }}}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ . }}}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* Environment every daemon gets (NODEWARD_<SECTION>__<KEY>), its own port included:
(dict "ctx" $ "port" <the daemon's /healthz, /readyz and /metrics port>). */}}
{{- define "nodeward.commonEnv" -}}
- name: NODEWARD_BUS__URL
  value: {{ include "nodeward.natsUrl" .ctx | quote }}
- name: NODEWARD_DAEMON__HOST
  value: "0.0.0.0"
- name: NODEWARD_DAEMON__PORT
  value: {{ .port | quote }}
- name: NODE_NAME
  valueFrom:
    fieldRef: {fieldPath: spec.nodeName}
{{- end -}}

{{/* The energy agent's port: agents.energy.metricsPort, else metricsPort + 1. */}}
{{- define "nodeward.energyPort" -}}
{{- .Values.agents.energy.metricsPort | default (add1 (int .Values.metricsPort)) -}}
{{- end -}}

{{/* The idleness agent's port: agents.idle.metricsPort, else metricsPort + 2. */}}
{{- define "nodeward.idlePort" -}}
{{- .Values.agents.idle.metricsPort | default (add (int .Values.metricsPort) 2) -}}
{{- end -}}

{{/* The user's env of a container: (dict "env" <map> "fixed" <the env the chart sets, as
rendered> "where" <the values key>). A name the chart sets already is refused: two entries
of one name, and the API server silently keeps one. */}}
{{- define "nodeward.extraEnv" -}}
{{- $taken := list -}}
{{- range regexFindAll "(?m)^- name: [^\\s]+" .fixed -1 -}}
{{- $taken = append $taken (trimPrefix "- name: " .) -}}
{{- end -}}
{{- range $k, $v := .env }}
{{- if has $k $taken }}
{{- fail (printf "%s: %s is set by the chart itself; change it through its own value or `config`" $.where $k) }}
{{- end }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* The service passwords: values, else the existing Secret (lookup), else new. Call once. */}}
{{- define "nodeward.natsPasswords" -}}
{{- $out := dict -}}
{{- $users := concat (keys .Values.services | sortAlpha) (list "admin" "operator" "console") -}}
{{- range $name := $users -}}
{{- $secret := lookup "v1" "Secret" $.Release.Namespace (printf "%s-nats-%s" $.Release.Name $name) -}}
{{- $pw := get $.Values.natsAuth.passwords $name -}}
{{- if and (not $pw) $secret $secret.data -}}
{{- $pw = get $secret.data "password" | b64dec -}}
{{- end -}}
{{- $_ := set $out $name ($pw | default (randAlphaNum 32)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* One `authorization` user as nats-server config (JSON values, `>` not escaped). */}}
{{- define "nodeward.natsUser" -}}
{{- toRawJson . -}}
{{- end -}}
