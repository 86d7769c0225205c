{{/* Names, labels and the PlatformConfig the RayService hands to the application. */}}

{{- define "firstlight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix. Short on purpose: KubeRay appends suffixes (-head-svc,
-serve-svc, -raycluster-xxxxx) and Service names must stay within 63 characters. */}}
{{- define "firstlight.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "firstlight.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "firstlight.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "firstlight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "firstlight.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "firstlight.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "firstlight.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: firstlight
firstlight/region: {{ .Values.region.name }}
{{- end -}}

{{- define "firstlight.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Where Secrets are mounted in Ray pods; the config names files under it. */}}
{{- define "firstlight.secretsDir" -}}/var/run/secrets/firstlight{{- end -}}

{{/* The Secret holding the regions' shared hop-signing key; empty when the region has
no peers. A region with peers must name one (the same key in every region). */}}
{{- define "firstlight.peerSecretName" -}}
{{- if .Values.region.peers -}}
{{- required "auth.peerSecret.existingSecret is required when region.peers is set: a Secret holding the key every region shares to sign its hops (docs/security.md)" .Values.auth.peerSecret.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "firstlight.redisSecretName" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.existingSecret -}}
{{- else -}}
{{- .Values.externalRedis.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "firstlight.redisPasswordKey" -}}
{{- if .Values.redis.enabled -}}{{ .Values.redis.passwordKey }}{{- else -}}{{ .Values.externalRedis.passwordKey }}{{- end -}}
{{- end -}}

{{/* The in-chart Redis's TLS Secret: empty unless redis.enabled and redis.tls.enabled. */}}
{{- define "firstlight.redisTlsSecret" -}}
{{- if and .Values.redis.enabled .Values.redis.tls.enabled -}}
{{- required "redis.tls.existingSecret is required with redis.tls.enabled: a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt for <release>-redis.<namespace>.svc (e.g. from a cert-manager Certificate)" .Values.redis.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "firstlight.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "%s://%s-redis.%s.svc:6379/0" (ternary "rediss" "redis" (not (empty (include "firstlight.redisTlsSecret" .)))) (include "firstlight.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "externalRedis.url is required when redis.enabled is false" .Values.externalRedis.url -}}
{{- end -}}
{{- end -}}

{{/* "true" when some model's source is fetched (hf:// or s3://), else empty. */}}
{{- define "firstlight.remoteModels" -}}
{{- range .Values.models -}}
{{- if or (hasPrefix "hf://" (.source | default "")) (hasPrefix "s3://" (.source | default "")) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when some model's source is on the Hugging Face Hub, else empty. */}}
{{- define "firstlight.hubModels" -}}
{{- range .Values.models -}}
{{- if hasPrefix "hf://" (.source | default "") -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The models, each remote one's fetch.cache_dir set to the node cache's mount unless
it names its own. */}}
{{- define "firstlight.models" -}}
{{- $models := list -}}
{{- range .Values.models -}}
{{- $model := deepCopy . -}}
{{- if or (hasPrefix "hf://" (.source | default "")) (hasPrefix "s3://" (.source | default "")) -}}
{{- $fetch := $model.fetch | default dict -}}
{{- if not $fetch.cache_dir -}}
{{- $_ := set $fetch "cache_dir" $.Values.modelSources.cache.mountPath -}}
{{- end -}}
{{- $_ := set $model "fetch" $fetch -}}
{{- end -}}
{{- $models = append $models $model -}}
{{- end -}}
{{- toYaml $models -}}
{{- end -}}

{{/* The application's PlatformConfig (mode kubernetes) as YAML: the config sections
of the values, plus what the chart decides. firstlight.k8s.helm_values maps a config
file onto these values; the chart tests check the round trip. */}}
{{- define "firstlight.platformConfig" -}}
{{- $v := .Values -}}
{{- $secrets := include "firstlight.secretsDir" . -}}
{{- $regions := list (dict "name" $v.region.name "peers" ($v.region.peers | default list)) -}}
{{- range $v.region.peers -}}
{{- $regions = append $regions (dict "name" .region) -}}
{{- end -}}
{{- $hints := merge (dict "redis_url" (include "firstlight.redisUrl" .)) (deepCopy $v.hints) -}}
{{- if include "firstlight.redisSecretName" . -}}
{{- $_ := set $hints "password" (dict "file" (printf "%s/redis/%s" $secrets (include "firstlight.redisPasswordKey" .))) -}}
{{- end -}}
{{- if include "firstlight.redisTlsSecret" . -}}
{{- $_ := set $hints "tls_ca_file" (printf "%s/redis-tls/ca.crt" $secrets) -}}
{{- end -}}
{{- $keys := list -}}
{{- $tenants := $v.auth.apiKeys.tenants | default dict -}}
{{- $contexts := $v.auth.apiKeys.dynamicContext | default dict -}}
{{- range $v.auth.apiKeys.keys -}}
{{- $entry := dict "file" (printf "%s/api-keys/%s" $secrets .) -}}
{{- with index $tenants . -}}
{{- $_ := set $entry "tenant" . -}}
{{- end -}}
{{- if hasKey $contexts . -}}
{{- $_ := set $entry "dynamic_context" (index $contexts . | default dict) -}}
{{- end -}}
{{- $keys = append $keys $entry -}}
{{- end -}}
{{- $auth := dict "enabled" true "api_keys" $keys -}}
{{- $_ := set $auth "operator_keys" (list (dict "file" (printf "%s/operator/%s" $secrets $v.auth.operatorKey.key))) -}}
{{- if include "firstlight.peerSecretName" . -}}
{{- $_ := set $auth "peer_secret" (dict "file" (printf "%s/peer/%s" $secrets $v.auth.peerSecret.key)) -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.auth.tenant_isolation) -}}
{{- $_ := set $auth "tenant_isolation" $v.auth.tenant_isolation -}}
{{- end -}}
{{- $config := dict
  "mode" "kubernetes"
  "region" $v.region.name
  "regions" $regions
  "models" (include "firstlight.models" . | fromYamlArray)
  "router" $v.router
  "hints" $hints
  "auth" $auth
  "telemetry" $v.telemetry
  "gateway" (merge (dict "host" "0.0.0.0" "port" 8000) (deepCopy $v.gateway))
-}}
{{- toYaml $config -}}
{{- end -}}

{{/* Ray Serve's config: one application, the region, built by firstlight serve's
import path with the config inline as its arguments. */}}
{{- define "firstlight.serveConfig" -}}
applications:
  - name: {{ .Values.region.name }}
    route_prefix: /
    import_path: firstlight.serve.app:build_app
    args:
      region: {{ .Values.region.name }}
      config:
{{ include "firstlight.platformConfig" . | indent 8 }}
{{- end -}}

{{/* Pod-level settings shared by the head and every worker group. */}}
{{- define "firstlight.podSpecCommon" -}}
automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
{{- with .Values.serviceAccount.name }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: api-keys
    secret:
      secretName: {{ .Values.auth.apiKeys.existingSecret }}
      defaultMode: 0440
      items:
        {{- range .Values.auth.apiKeys.keys }}
        - {key: {{ . }}, path: {{ . }}}
        {{- end }}
  - name: operator-key
    secret:
      secretName: {{ .Values.auth.operatorKey.existingSecret }}
      defaultMode: 0440
      items:
        - {key: {{ .Values.auth.operatorKey.key }}, path: {{ .Values.auth.operatorKey.key }}}
  {{- if include "firstlight.peerSecretName" . }}
  - name: peer-secret
    secret:
      secretName: {{ include "firstlight.peerSecretName" . }}
      defaultMode: 0440
      items:
        - {key: {{ .Values.auth.peerSecret.key }}, path: {{ .Values.auth.peerSecret.key }}}
  {{- end }}
  {{- if include "firstlight.redisSecretName" . }}
  - name: redis-password
    secret:
      secretName: {{ include "firstlight.redisSecretName" . }}
      defaultMode: 0440
      items:
        - {key: {{ include "firstlight.redisPasswordKey" . }}, path: {{ include "firstlight.redisPasswordKey" . }}}
  {{- end }}
  {{- with include "firstlight.redisTlsSecret" . }}
  - name: redis-tls-ca
    secret:
      secretName: {{ . }}
      defaultMode: 0444
      items:
        - {key: ca.crt, path: ca.crt}
  {{- end }}
  {{- if .Values.modelStorage.existingClaim }}
  - name: models
    persistentVolumeClaim:
      claimName: {{ .Values.modelStorage.existingClaim }}
      readOnly: true
  {{- end }}
  {{- if include "firstlight.remoteModels" . }}
  - name: model-cache
    {{- if .Values.modelSources.cache.hostPath }}
    hostPath:
      path: {{ .Values.modelSources.cache.hostPath }}
      type: DirectoryOrCreate
    {{- else }}
    emptyDir:
      {{- with .Values.modelSources.cache.sizeLimit }}
      sizeLimit: {{ . }}
      {{- end }}
    {{- end }}
  {{- end }}
  - name: dshm
    emptyDir:
      medium: Memory
  {{- with .Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Container-level settings shared by the head and every worker group. */}}
{{- define "firstlight.containerCommon" -}}
image: {{ include "firstlight.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- with .Values.containerSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
env:
  # Block hashes of hints and of vLLM's prefix cache derive from this seed: every pod
  # of every region must share it (hints.hash_seed).
  - name: PYTHONHASHSEED
    value: {{ .Values.hints.hash_seed | int64 | quote }}
  # The image sets it to 1: nothing reaches the Hugging Face Hub unless a model's
  # source is hf://, which the platform fetches before the engine loads the folder.
  - name: HF_HUB_OFFLINE
    value: {{ ternary "0" "1" (not (empty (include "firstlight.hubModels" .))) | quote }}
  {{- range .Values.modelSources.secretEnv }}
  - name: {{ .name }}
    valueFrom:
      secretKeyRef:
        name: {{ .existingSecret }}
        key: {{ .key }}
  {{- end }}
  # The data plane (gateway.ingress, gateway.throughput_optimized): Ray Serve reads it from
  # the environment of its processes (firstlight.serve.data_plane.ray_environment).
  - name: RAY_SERVE_ENABLE_HA_PROXY
    value: {{ ternary "1" "0" (eq (.Values.gateway.ingress | default "haproxy") "haproxy") | quote }}
  - name: RAY_SERVE_THROUGHPUT_OPTIMIZED
    value: {{ ternary "1" "0" (ne .Values.gateway.throughput_optimized false) | quote }}
  # A request a dying gateway took but never answered goes to another gateway.
  - name: RAY_SERVE_HAPROXY_RETRY_ON
    value: "conn-failure empty-response"
  {{- if include "firstlight.redisTlsSecret" . }}
  # Ray's GCS verifies the in-chart Redis's certificate (GCS fault tolerance).
  - name: RAY_REDIS_CA_CERT
    value: {{ include "firstlight.secretsDir" . }}/redis-tls/ca.crt
  {{- end }}
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
volumeMounts:
  - name: api-keys
    mountPath: {{ include "firstlight.secretsDir" . }}/api-keys
    readOnly: true
  - name: operator-key
    mountPath: {{ include "firstlight.secretsDir" . }}/operator
    readOnly: true
  {{- if include "firstlight.peerSecretName" . }}
  - name: peer-secret
    mountPath: {{ include "firstlight.secretsDir" . }}/peer
    readOnly: true
  {{- end }}
  {{- if include "firstlight.redisSecretName" . }}
  - name: redis-password
    mountPath: {{ include "firstlight.secretsDir" . }}/redis
    readOnly: true
  {{- end }}
  {{- if include "firstlight.redisTlsSecret" . }}
  - name: redis-tls-ca
    mountPath: {{ include "firstlight.secretsDir" . }}/redis-tls
    readOnly: true
  {{- end }}
  {{- if .Values.modelStorage.existingClaim }}
  - name: models
    mountPath: {{ .Values.modelStorage.mountPath }}
    readOnly: true
  {{- end }}
  {{- if include "firstlight.remoteModels" . }}
  - name: model-cache
    mountPath: {{ .Values.modelSources.cache.mountPath }}
  {{- end }}
  - name: dshm
    mountPath: /dev/shm
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{- define "firstlight.podMetadata" -}}
labels:
  {{- include "firstlight.labels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .extraLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Paths routed from outside, as a JSON list of {path, type}. */}}
{{- define "firstlight.publicPaths" -}}
{{- $paths := list (dict "path" "/v1" "type" "Prefix") (dict "path" "/readyz" "type" "Exact") (dict "path" "/healthz" "type" "Exact") -}}
{{- if .operator -}}
{{- $paths = concat $paths (list (dict "path" "/dashboard" "type" "Prefix") (dict "path" "/metrics" "type" "Exact")) -}}
{{- end -}}
{{- toJson $paths -}}
{{- end -}}

{{/* "true" when the Prometheus Operator's kind (.kind: ServiceMonitor, PodMonitor,
PrometheusRule) may be rendered: the cluster serves it (`helm install`/`upgrade` see the
API server's resources; `helm template` only what --api-versions names, e.g.
monitoring.coreos.com/v1/ServiceMonitor), or monitoring.assumePrometheusOperator forces
it. Without either, an install on a cluster without the operator would fail with "no
matches for kind". */}}
{{- define "firstlight.hasMonitoringApi" -}}
{{- if or .root.Values.monitoring.assumePrometheusOperator (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when a PodDisruptionBudget can protect worker group .group: its floor
(minReplicas) is above podDisruptionBudget.minAvailable, so the budget both keeps
minAvailable pods and still lets a drain proceed. */}}
{{- define "firstlight.pdbProtects" -}}
{{- if gt (int .group.minReplicas) (int .root.Values.podDisruptionBudget.minAvailable) -}}
true
{{- end -}}
{{- end -}}

{{/* The region's Redis as Ray's GCS expects it (host:port, or rediss://host:port for
TLS): no database number (the GCS always uses database 0, its keys under the
RayCluster's UID) and no credentials. Empty when GCS fault tolerance is off. */}}
{{- define "firstlight.gcsRedisAddress" -}}
{{- if .Values.rayCluster.gcsFaultTolerance.enabled -}}
{{- if .Values.redis.enabled -}}
{{- printf "%s%s-redis.%s.svc:6379" (ternary "rediss://" "" (not (empty (include "firstlight.redisTlsSecret" .)))) (include "firstlight.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- $url := urlParse (include "firstlight.redisUrl" .) -}}
{{- $host := $url.host -}}
{{- if not (regexMatch ":[0-9]+$" $host) -}}
{{- $host = printf "%s:6379" $host -}}
{{- end -}}
{{- if eq $url.scheme "rediss" -}}
{{- printf "rediss://%s" $host -}}
{{- else -}}
{{- $host -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The engine PodMonitor's metric relabelings: keep only vLLM's series at Ray's metrics
agent and give them back vLLM's names and the labels of the local relay
(platform/firstlight/telemetry/engine_metrics.py). tests/serve/test_engine_metrics_ray.py
runs these rules in a real Prometheus against a real replica's Ray metrics agent. */}}
{{- define "firstlight.engineMetricRelabelings" -}}
- {sourceLabels: [__name__], regex: "ray_vllm_.+", action: keep}
- {sourceLabels: [__name__], regex: "ray_vllm_(.+)", targetLabel: __name__, replacement: "vllm:$1", action: replace}
- {sourceLabels: [ReplicaId], regex: "(.+)", targetLabel: replica, replacement: "$1", action: replace}
- {targetLabel: region, replacement: {{ .Values.region.name | quote }}, action: replace}
- {regex: "ReplicaId|Component|NodeAddress|SessionName|Version|WorkerId|otel_scope_.+", action: labeldrop}
{{- end -}}

{{/* A CPU quantity from millicores: whole cores as "2", others as "1500m". */}}
{{- define "firstlight.cpuQuantity" -}}
{{- $millis := int . -}}
{{- ternary (printf "%d" (div $millis 1000)) (printf "%dm" $millis) (eq (mod $millis 1000) 0) -}}
{{- end -}}

{{/* Pods of the gateway group (rayCluster.gateways): gateway.replicas over gatewaysPerPod,
rounded up, and at least two from two gateways, so one pod's loss leaves a gateway. Its
replicas, minReplicas and maxReplicas alike: no autoscaling of it. */}}
{{- define "firstlight.gatewayPods" -}}
{{- $replicas := int .Values.gateway.replicas -}}
{{- $perPod := int .Values.rayCluster.gateways.gatewaysPerPod -}}
{{- $pods := div (add $replicas (sub $perPod 1)) $perPod -}}
{{- if and (ge $replicas 2) (lt $pods 2) -}}
{{- $pods = 2 -}}
{{- end -}}
{{- $pods -}}
{{- end -}}

{{/* A gateway pod's custom Ray resources as rayStartParams.resources takes them: a JSON
object inside quotes, its own quotes escaped (the form KubeRay passes to `ray start` and
Ray's autoscaler parses). gatewaysPerPod units of firstlight_gateway
(firstlight.serve.placement's GATEWAY_RESOURCE), of which each gateway replica asks one:
a pod hosts at most gatewaysPerPod gateways, and no other pod any. Independent of
gateway.replicas, so a change of it never changes the pod template. */}}
{{- define "firstlight.gatewayRayResources" -}}
{{- printf "\"{\\\"firstlight_gateway\\\": %d}\"" (int .Values.rayCluster.gateways.gatewaysPerPod) -}}
{{- end -}}

{{/* A gateway pod's container resources: rayCluster.gateways.resources when set, as they
are; otherwise computed (rayCluster.gateways.sizing) for gatewaysPerPod gateways: a CPU
request of the fixed part plus a part per gateway, no CPU limit (a CFS quota throttles
the request path in bursts), memory requested and limited alike. Independent of
gateway.replicas. */}}
{{- define "firstlight.gatewayResources" -}}
{{- $gateways := .Values.rayCluster.gateways -}}
{{- if $gateways.resources -}}
{{- toYaml $gateways.resources -}}
{{- else -}}
{{- $sizing := $gateways.sizing -}}
{{- $perPod := int $gateways.gatewaysPerPod -}}
{{- $millis := add (int $sizing.fixedCpuMillis) (mul (int $sizing.cpuPerGatewayMillis) $perPod) -}}
{{- $memory := printf "%dMi" (add (int $sizing.fixedMemoryMi) (mul (int $sizing.memoryPerGatewayMi) $perPod)) -}}
requests:
  cpu: {{ include "firstlight.cpuQuantity" $millis | quote }}
  memory: {{ $memory | quote }}
limits:
  memory: {{ $memory | quote }}
{{- end -}}
{{- end -}}

{{/* The gateway pods' affinity: rayCluster.gateways.affinity when set; otherwise a
preferred anti-affinity between them on the node's hostname, so a node's loss takes one
where the cluster has room for that. */}}
{{- define "firstlight.gatewayAffinity" -}}
{{- with .Values.rayCluster.gateways.affinity -}}
{{- toYaml . -}}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "firstlight.selectorLabels" . | nindent 12 }}
            app.kubernetes.io/component: ray-worker
            firstlight/worker-group: gateways
{{- end -}}
{{- end -}}
