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

{{/* The NATS URL: bus.url; empty is refused in one line. */}}
{{- define "nodeward.natsUrl" -}}
{{- if not .Values.bus.url -}}
{{- fail "bus.url: empty; set the NATS client URL, e.g. nats://nats.nats.svc:4222 (docs/deploying.md)" -}}
{{- end -}}
{{ .Values.bus.url }}
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

{{/* The nodeward config file every pod reads (/etc/nodeward/config.yaml): `config`, with
bus.partitions, bus.tls_* (bus.tls) and, in natsAuth.mode=callout, the auth callout's
section `auth_callout` (the chart's paths win over the same keys in config.auth_callout). */}}
{{- define "nodeward.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $bus := get $config "bus" | default dict -}}
{{- $_ := set $bus "partitions" (int .Values.partitions) -}}
{{- $t := .Values.bus.tls -}}
{{- if $t.enabled -}}
{{- if or $t.ca.secretName $t.ca.configMapName -}}
{{- $_ := set $bus "tls_ca_file" "/var/run/secrets/nodeward.io/nats-tls/ca.crt" -}}
{{- end -}}
{{- if $t.clientCert.secretName -}}
{{- $_ := set $bus "tls_cert_file" "/var/run/secrets/nodeward.io/nats-tls/tls.crt" -}}
{{- $_ := set $bus "tls_key_file" "/var/run/secrets/nodeward.io/nats-tls/tls.key" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $config "bus" $bus -}}
{{- if eq (include "nodeward.mode" .) "callout" -}}
{{- $c := .Values.natsAuth.callout -}}
{{- $ac := dict
  "issuer_seed_file" "/etc/nodeward/auth-callout/issuer.nk"
  "permissions_file" "/etc/nodeward/nats-permissions.json"
  "account" ($c.account | default "NODEWARD")
  "namespace" .Release.Namespace
  "release" .Release.Name
  "audience" ($c.audience | default "nats") -}}
{{- if $c.xkey -}}
{{- $_ := set $ac "xkey_seed_file" "/etc/nodeward/auth-callout/xkey.nk" -}}
{{- end -}}
{{- $_ := set $config "auth_callout" (merge $ac (get $config "auth_callout" | default dict)) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Pod scheduling of one component: (dict "own" <its values> "defaults" <fallback values,
or dict> "affinity" <default affinity, or dict>). nodeSelector, tolerations, affinity and
priorityClassName: each its own, else the fallback's. Keys of a pod spec. */}}
{{- define "nodeward.scheduling" -}}
{{- $own := .own | default dict -}}
{{- $def := .defaults | default dict -}}
{{- with ($own.nodeSelector | default $def.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($own.tolerations | default $def.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($own.affinity | default $def.affinity | default $.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($own.priorityClassName | default $def.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* extraVolumes (key "extraVolumes") or extraVolumeMounts (key "extraVolumeMounts") of
one component, as list items: the global ones, then each of `from` (values maps) in order.
(dict "ctx" $ "key" <key> "from" (list <defaults> <own>)) */}}
{{- define "nodeward.extra" -}}
{{- $all := get .ctx.Values .key | default list -}}
{{- range .from -}}
{{- $all = concat $all (get (. | default dict) $.key | default list) -}}
{{- end -}}
{{- with $all }}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{/* A ServiceAccount with no role: (dict "ctx" $ "name" <component>). */}}
{{- define "nodeward.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ printf "%s-%s" .ctx.Release.Name .name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "nodeward.labels" .ctx | nindent 4 }}
    app.kubernetes.io/component: {{ .name }}
automountServiceAccountToken: false
{{- end -}}

{{/* Whether to render a Prometheus operator kind: (dict "ctx" $ "key" "serviceMonitors" or
"prometheusRules"). true or false as set; auto (or unset): when the cluster serves
monitoring.coreos.com/v1. Non-empty means yes. */}}
{{- define "nodeward.monitoring" -}}
{{- $v := toString (get .ctx.Values.monitoring .key) -}}
{{- if eq $v "true" -}}
true
{{- else if eq $v "false" -}}
{{- else if has $v (list "auto" "") -}}
{{- if .ctx.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end -}}
{{- else -}}
{{- fail (printf "monitoring.%s: %q; true, false or auto" .key $v) -}}
{{- end -}}
{{- end -}}
