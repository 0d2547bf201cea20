{{/* ServiceAccount, roles and bindings of one component: (dict "ctx" $ "name" "cordon") */}}
{{- define "nodeward.rbac" -}}
{{- $ctx := .ctx -}}
{{- $name := .name -}}
{{- $rules := get ($ctx.Files.Get "files/rbac.yaml" | fromYaml) $name -}}
{{- $full := printf "%s-%s" $ctx.Release.Name $name -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $full }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "nodeward.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
automountServiceAccountToken: false
{{- if $rules.cluster }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $full }}
  labels:
    {{- include "nodeward.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
rules:
  {{- toYaml $rules.cluster | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $full }}
  labels:
    {{- include "nodeward.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ $full }}}
subjects:
  - {kind: ServiceAccount, name: {{ $full }}, namespace: {{ $ctx.Release.Namespace }}}
{{- end }}
{{- if $rules.namespaced }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $full }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "nodeward.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
rules:
  {{- toYaml $rules.namespaced | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $full }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "nodeward.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: {{ $full }}}
subjects:
  - {kind: ServiceAccount, name: {{ $full }}, namespace: {{ $ctx.Release.Namespace }}}
{{- end }}
{{- end -}}
