{{- /*
How nodeward's components sign in to NATS (natsAuth.mode) and what the server is told
(the include file auth.conf of the Secret <release>-nats-auth, templates/nats-auth.yaml).
The grants come from files/nats-permissions.json, which `python -m launch.access
nats-permissions` generates from each service's and agent's declared GRANTS through
nodeward/nats_auth.py.
*/ -}}

{{/* natsAuth.mode, checked: callout, nkeys or passwords. */}}
{{- define "nodeward.mode" -}}
{{- $m := .Values.natsAuth.mode | default "" -}}
{{- if not (has $m (list "callout" "nkeys" "passwords")) -}}
{{- fail (printf "natsAuth.mode: %q; one of callout, nkeys, passwords" $m) -}}
{{- end -}}
{{- $m -}}
{{- end -}}

{{/* Every component with a NATS identity of its own, as a JSON list: each enabled service
(in name order), admin (the provision Job), operator (people), console (when enabled). The
node agents are not in it: one identity per node (agents.nodeKeys, or the callout). */}}
{{- define "nodeward.natsIdentities" -}}
{{- $out := list -}}
{{- range $name, $svc := .Values.services -}}
{{- if $svc.enabled -}}{{- $out = append $out $name -}}{{- end -}}
{{- end -}}
{{- $out = concat $out (list "admin" "operator") -}}
{{- if .Values.console.enabled -}}{{- $out = append $out "console" -}}{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* One identity's user name and permissions from files/nats-permissions.json, as JSON:
(dict "grants" <the parsed file> "name" <identity>). */}}
{{- define "nodeward.natsGrant" -}}
{{- $g := .grants -}}
{{- $name := .name -}}
{{- if eq $name "admin" -}}
{{- toRawJson $g.admin -}}
{{- else if eq $name "operator" -}}
{{- toRawJson $g.operator -}}
{{- else if hasKey $g.services $name -}}
{{- toRawJson (get $g.services $name) -}}
{{- else if hasKey $g.readers $name -}}
{{- toRawJson (get $g.readers $name) -}}
{{- else -}}
{{- fail (printf "services.%s: no NATS grants in files/nats-permissions.json (python -m launch.access nats-permissions)" $name) -}}
{{- end -}}
{{- end -}}

{{/* natsAuth.mode=passwords: where each identity's password comes from, as JSON
{<name>: {"source": inline|existing|generated, "secret", "key", "password", "server"}}:
`secret`/`key` hold it for the pods, `server` is what auth.conf gets (hashes.<name>, else
the password itself; a generated one bcrypt-hashed, as it is random anyway). Call once per
template: a generated password is made here. */}}
{{- define "nodeward.natsPasswords" -}}
{{- $p := .Values.natsAuth.passwords | default dict -}}
{{- $hashes := $p.hashes | default dict -}}
{{- $out := dict -}}
{{- range $name := include "nodeward.natsIdentities" $ | fromJsonArray -}}
{{- $own := printf "%s-nats-%s" $.Release.Name $name -}}
{{- $pw := get $p $name | default "" | toString -}}
{{- $hash := get $hashes $name | default "" | toString -}}
{{- if and $hash (not (regexMatch "^\\$2[aby]?\\$[0-9]{2}\\$[./A-Za-z0-9]{53}$" $hash)) -}}
{{- fail (printf "natsAuth.passwords.hashes.%s: not a bcrypt hash ($2a$11$... from `nats server passwd`)" $name) -}}
{{- end -}}
{{- if $pw -}}
{{- $_ := set $out $name (dict "source" "inline" "secret" $own "key" "password" "password" $pw "server" ($hash | default $pw)) -}}
{{- else if $p.existingSecret -}}
{{- if not $hash -}}
{{- fail (printf "natsAuth.passwords.hashes.%s: required with natsAuth.passwords.existingSecret (the chart cannot read that Secret; give the bcrypt hash of its key %s, from `nats server passwd`)" $name $name) -}}
{{- end -}}
{{- $_ := set $out $name (dict "source" "existing" "secret" $p.existingSecret "key" $name "password" "" "server" $hash) -}}
{{- else if $p.generate -}}
{{- $old := lookup "v1" "Secret" $.Release.Namespace $own -}}
{{- if and $old $old.data (hasKey $old.data "password") -}}
{{- $pw = get $old.data "password" | b64dec -}}
{{- else -}}
{{- $pw = randAlphaNum 32 -}}
{{- end -}}
{{- $_ := set $out $name (dict "source" "generated" "secret" $own "key" "password" "password" $pw "server" ($hash | default (bcrypt $pw))) -}}
{{- else -}}
{{- fail (printf "natsAuth.passwords: no password for %s; give natsAuth.passwords.%s, or natsAuth.passwords.existingSecret (key %s) with natsAuth.passwords.hashes.%s, or natsAuth.passwords.generate: true" $name $name $name $name) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* natsAuth.mode=nkeys: the Secret holding one identity's seed (key seed.nk). */}}
{{- define "nodeward.seedSecret" -}}
{{- get (.ctx.Values.natsAuth.nkeys.seedSecrets | default dict) .name | default (printf "%s-nkey-%s" .ctx.Release.Name .name) -}}
{{- end -}}

{{/* The users of the server's `authorization {}` block (modes nkeys and passwords), as
JSON: each identity, then one nkey user per node of agents.nodeKeys with its grants.
(dict "ctx" $ "passwords" <natsPasswords, parsed; mode passwords>) */}}
{{- define "nodeward.natsUsers" -}}
{{- $ := .ctx -}}
{{- $passwords := .passwords | default dict -}}
{{- $mode := include "nodeward.mode" $ -}}
{{- $grants := $.Files.Get "files/nats-permissions.json" | fromJson -}}
{{- $users := list -}}
{{- range $name := include "nodeward.natsIdentities" $ | fromJsonArray -}}
{{- $g := include "nodeward.natsGrant" (dict "grants" $grants "name" $name) | fromJson -}}
{{- if eq $mode "nkeys" -}}
{{- $key := get ($.Values.natsAuth.nkeys.publicKeys | default dict) $name | default "" -}}
{{- if not (regexMatch "^U[A-Z2-7]{55}$" $key) -}}
{{- fail (printf "natsAuth.nkeys.publicKeys.%s: %q is not an nkey user public key (U + 55 base32 characters; `nk -gen user -pubout`)" $name $key) -}}
{{- end -}}
{{- $users = append $users (dict "nkey" $key "permissions" $g.permissions) -}}
{{- else -}}
{{- $users = append $users (dict "user" $g.user "password" (get (get $passwords $name) "server") "permissions" $g.permissions) -}}
{{- end -}}
{{- end -}}
{{- if $.Values.agents.enabled -}}
{{- $agent := toRawJson $grants.agent.permissions -}}
{{- range $node, $key := $.Values.agents.nodeKeys -}}
{{- if not (regexMatch "^U[A-Z2-7]{55}$" $key) -}}
{{- fail (printf "agents.nodeKeys.%s: %q is not an nkey user public key (U + 55 base32 characters)" $node $key) -}}
{{- end -}}
{{- $perms := replace "__NODE__" (include "nodeward.token" $node) $agent | fromJson -}}
{{- $users = append $users (dict "nkey" $key "permissions" $perms) -}}
{{- end -}}
{{- end -}}
{{- toRawJson $users -}}
{{- end -}}

{{/* natsAuth.mode=callout: the server's include, public keys only: the block of
nodeward.nats_auth.callout_authorization (which the callout's tests run on a real
nats-server; tests/integration/test_helm_modes.py keeps the two equal), plus the xkey when
natsAuth.callout.xkey is set. Keep it here, in one place. */}}
{{- define "nodeward.calloutInclude" -}}
{{- $c := .Values.natsAuth.callout -}}
{{- if not (regexMatch "^U[A-Z2-7]{55}$" ($c.userKey | default "")) -}}
{{- fail (printf "natsAuth.callout.userKey: %q is not an nkey user public key (U...; `nodeward auth-callout --new-keys DIR` prints it), required in natsAuth.mode=callout" ($c.userKey | default "")) -}}
{{- end -}}
{{- if not (regexMatch "^A[A-Z2-7]{55}$" ($c.issuerKey | default "")) -}}
{{- fail (printf "natsAuth.callout.issuerKey: %q is not an nkey account public key (A...; `nodeward auth-callout --new-keys DIR` prints it), required in natsAuth.mode=callout" ($c.issuerKey | default "")) -}}
{{- end -}}
{{- if and $c.xkey (not (regexMatch "^X[A-Z2-7]{55}$" $c.xkey)) -}}
{{- fail (printf "natsAuth.callout.xkey: %q is not a curve public key (X...; `nk -gen curve -pubout`)" $c.xkey) -}}
{{- end -}}
{{- $account := $c.account | default "NODEWARD" -}}
# nodeward's accounts and its auth callout (generated by the nodeward chart). Public keys only.
accounts {
  {{ $account }}: { jetstream: enabled }
  AUTH: { users: [ { nkey: {{ $c.userKey }} } ] }
}
authorization {
  timeout: {{ $c.timeout | default 5 }}
  auth_callout {
    issuer: {{ $c.issuerKey }}
    auth_users: [ {{ $c.userKey }} ]
    account: AUTH
    {{- with $c.xkey }}
    xkey: {{ . }}
    {{- end }}
  }
}
{{- end -}}

{{/* The env that signs a pod in to NATS: (dict "ctx" $ "name" <identity>): a service's
name, admin or console. */}}
{{- define "nodeward.natsEnv" -}}
{{- $ := .ctx -}}
{{- $mode := include "nodeward.mode" $ -}}
{{- if eq $mode "callout" -}}
# Its projected ServiceAccount token; the auth callout gives it its grants.
- name: NODEWARD_BUS__TOKEN_FILE
  value: /var/run/secrets/nodeward.io/nats/token
{{- else if eq $mode "nkeys" -}}
- name: NODEWARD_BUS__NKEY_SEED_FILE
  value: /var/run/secrets/nodeward.io/nats/seed.nk
{{- else -}}
{{- $grants := $.Files.Get "files/nats-permissions.json" | fromJson -}}
{{- $g := include "nodeward.natsGrant" (dict "grants" $grants "name" .name) | fromJson -}}
{{- $p := $.Values.natsAuth.passwords | default dict -}}
{{- $secret := printf "%s-nats-%s" $.Release.Name .name -}}
{{- $key := "password" -}}
{{- if and (not (get $p .name)) $p.existingSecret -}}
{{- $secret = $p.existingSecret -}}
{{- $key = .name -}}
{{- end -}}
- name: NODEWARD_BUS__USER
  value: {{ $g.user | quote }}
- name: NODEWARD_BUS__PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $key }}}
{{- end -}}
{{- end -}}

{{/* The volumes a pod needs for NATS, as list items (maybe none): (dict "ctx" $ "name"
<identity> "agent" <bool>). nats-credentials: the projected ServiceAccount token (callout)
or the identity's seed (nkeys; agents keep theirs on the node); nats-tls: bus.tls. */}}
{{- define "nodeward.natsVolumes" -}}
{{- $ := .ctx -}}
{{- $mode := include "nodeward.mode" $ -}}
{{- if eq $mode "callout" }}
- name: nats-credentials
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ $.Values.natsAuth.callout.audience | default "nats" | quote }}
          expirationSeconds: 3600
          path: token
{{- else if and (eq $mode "nkeys") (not .agent) }}
- name: nats-credentials
  secret:
    secretName: {{ include "nodeward.seedSecret" (dict "ctx" $ "name" .name) }}
    defaultMode: 0440
    items: [{key: seed.nk, path: seed.nk}]
{{- end }}
{{- include "nodeward.natsTlsVolume" $ }}
{{- end -}}

{{/* bus.tls: the volume nats-tls (list item), or nothing. */}}
{{- define "nodeward.natsTlsVolume" -}}
{{- $t := .Values.bus.tls -}}
{{- if $t.enabled }}
{{- if and (not $t.ca.secretName) (not $t.ca.configMapName) (not $t.clientCert.secretName) }}
{{- fail "bus.tls.enabled: give bus.tls.ca.secretName or bus.tls.ca.configMapName (the CA) and/or bus.tls.clientCert.secretName" }}
{{- end }}
{{- if and $t.ca.secretName $t.ca.configMapName }}
{{- fail "bus.tls.ca: secretName or configMapName, not both" }}
{{- end }}
- name: nats-tls
  projected:
    defaultMode: 0440
    sources:
      {{- if $t.ca.secretName }}
      - secret:
          name: {{ $t.ca.secretName }}
          items: [{key: {{ $t.ca.key | default "ca.crt" }}, path: ca.crt}]
      {{- else if $t.ca.configMapName }}
      - configMap:
          name: {{ $t.ca.configMapName }}
          items: [{key: {{ $t.ca.key | default "ca.crt" }}, path: ca.crt}]
      {{- end }}
      {{- with $t.clientCert.secretName }}
      - secret:
          name: {{ . }}
          items:
            - {key: {{ $t.clientCert.certKey | default "tls.crt" }}, path: tls.crt}
            - {key: {{ $t.clientCert.keyKey | default "tls.key" }}, path: tls.key}
      {{- end }}
{{- end }}
{{- end -}}

{{/* The mounts of natsVolumes: same arguments, list items (maybe none). */}}
{{- define "nodeward.natsMounts" -}}
{{- $ := .ctx -}}
{{- $mode := include "nodeward.mode" $ -}}
{{- if or (eq $mode "callout") (and (eq $mode "nkeys") (not .agent)) }}
- {name: nats-credentials, mountPath: /var/run/secrets/nodeward.io/nats, readOnly: true}
{{- end }}
{{- include "nodeward.natsTlsMount" $ }}
{{- end -}}

{{/* bus.tls: the mount of nats-tls (list item), or nothing. */}}
{{- define "nodeward.natsTlsMount" -}}
{{- if .Values.bus.tls.enabled }}
- {name: nats-tls, mountPath: /var/run/secrets/nodeward.io/nats-tls, readOnly: true}
{{- end }}
{{- end -}}

{{/* The env the chart sets in the auth callout's container (root context). */}}
{{- define "nodeward.calloutEnv" -}}
{{ include "nodeward.commonEnv" (dict "ctx" . "port" .Values.metricsPort) }}
{{- if .Values.natsAuth.callout.operatorMode }}
# Its own NATS user (nodeward's account, its auth_users): a user JWT and seed.
- name: NODEWARD_BUS__CREDS_FILE
  value: /etc/nodeward/auth-callout/user.creds
{{- else }}
# Its own NATS user (account AUTH), the one user the server does not hand to the callout.
- name: NODEWARD_BUS__NKEY_SEED_FILE
  value: /etc/nodeward/auth-callout/user.nk
{{- end }}
{{- end -}}
