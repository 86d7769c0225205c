"""JSON schemas of the chart's own (camelCase) value sections.

Read by :func:`firstlight.k8s.values_schema.values_schema`, which joins them with the
config sections generated from ``PlatformConfig``. Sections made of our own keys reject
unknown keys (a typo fails ``helm install`` instead of being ignored); Kubernetes
objects passed through verbatim (resources, tolerations, affinity, annotations) are
checked only for their JSON type.
"""

from __future__ import annotations

from typing import Any

from firstlight.k8s._schema_builders import (
    DNS_LABEL,
    DNS_NAME,
    DURATION,
    ENV,
    SECRET_KEY,
    SECRET_NAME,
    boolean,
    integer,
    k8s,
    obj,
    placement,
    pod_monitor,
    string,
    string_map,
)

__all__ = ["CHART_SECTIONS"]


_WORKER_GROUP = obj(
    "A group of Ray worker pods (one accelerator type).",
    ("name", "minReplicas", "maxReplicas"),
    name=string(
        "Worker group name (Ray's groupName); not gateways, the gateway pods' group.",
        pattern=DNS_LABEL,
    ),
    replicas=integer("Pods at install time (the autoscaler then moves it).", 0, 1000),
    minReplicas=integer("Fewest pods the Ray autoscaler keeps (0 scales to zero).", 0, 1000),
    maxReplicas=integer("Most pods the Ray autoscaler may start.", 0, 1000),
    gpus=integer("GPUs per pod (nvidia.com/gpu); 0 for a CPU group.", 0, 16),
    **placement("this group's pods"),
)

CHART_SECTIONS: dict[str, dict[str, Any]] = {
    "global": k8s(
        "What an umbrella chart shares with its subcharts (Helm's `global`); this chart "
        "reads none of it, but takes it, so it can be a subchart."
    ),
    "podSecurityContext": k8s(
        "Security context of every Ray pod (null a key to drop it, e.g. runAsUser where "
        "the platform assigns users)."
    ),
    "containerSecurityContext": k8s("Security context of every Ray container."),
    "serviceAccount": obj(
        "The Ray pods' service account.",
        name=string("Service account name; empty: the namespace's default."),
        automountToken=boolean("Mount the service account's token in the Ray pods."),
    ),
    "priorityClassName": string("PriorityClass of the Ray pods; empty: none."),
    "topologySpreadConstraints": k8s("Topology spread constraints of every Ray pod.", "array"),
    "extraVolumes": k8s("Extra volumes of every Ray pod.", "array"),
    "extraVolumeMounts": k8s("Where every Ray container mounts the extra volumes.", "array"),
    "nameOverride": string("Replaces the chart name in resource names.", maxLength=40),
    "fullnameOverride": string("Replaces release-chart in resource names.", maxLength=40),
    "image": obj(
        "Firstlight's container image (the repository's Dockerfile).",
        ("repository",),
        repository=string("Image repository.", minLength=1),
        tag=string("Image tag; empty: the chart's appVersion (GPU build)."),
        digest=string(
            "Image digest (sha256:...); set, the pods run repository@digest and the tag "
            "is ignored: the exact image, whatever the tag points to later.",
            pattern="^(sha256:[a-f0-9]{64})?$",
        ),
        pullPolicy={"enum": ["Always", "IfNotPresent", "Never"], "description": "Pull policy."},
    ),
    "imagePullSecrets": k8s("Secrets for pulling the image ([{name: ...}]).", "array"),
    "podLabels": string_map("Extra labels on every pod."),
    "podAnnotations": string_map("Extra annotations on every pod."),
    "extraEnv": k8s("Extra environment variables (Kubernetes EnvVar list) on Ray pods.", "array"),
    "rayCluster": obj(
        "The RayService's Ray cluster: a CPU-only head, the CPU-only gateway pods and "
        "accelerator worker groups.",
        ("head", "gateways", "workerGroups"),
        rayVersion=string("Ray version in the image (KubeRay uses it for compatibility)."),
        upgradeStrategy=string(
            "On a Ray cluster change: NewCluster (a new cluster, traffic moves when it "
            "serves) or None (the running cluster is left as it is).",
            pattern="^(NewCluster|None)$",
        ),
        gcsFaultTolerance=obj(
            "GCS fault tolerance: the head's metadata in the region's Redis, so a head "
            "restart keeps the workers and their replicas.",
            enabled=boolean("Use the region's Redis (redis or externalRedis) for the GCS."),
        ),
        autoscaling=obj(
            "Ray's in-tree autoscaler.",
            enabled=boolean("Scale worker groups between minReplicas and maxReplicas."),
            idleTimeoutSeconds=integer("Seconds an idle worker lives before removal.", 1, 86400),
        ),
        head=obj(
            "The head pod (Ray's core, the Serve controller, Serve's proxy and HAProxy out "
            "of the serve Service; no model, no gateway): a fixed size, whatever "
            "gateway.replicas.",
            **placement("the head pod"),
        ),
        gateways=obj(
            "The gateway pods: a CPU-only worker group (groupName gateways) running every "
            "gateway replica and nothing else; gateway.replicas / gatewaysPerPod pods, "
            "rounded up, at least two from two gateways.",
            ("gatewaysPerPod", "sizing"),
            gatewaysPerPod=integer(
                "Gateways one pod hosts at most (the firstlight_gateway units it advertises).",
                1,
                8,
            ),
            **{
                **placement("a gateway pod"),
                "resources": k8s(
                    "Container resources of a gateway pod (requests/limits), used as they "
                    "are; empty: computed by sizing."
                ),
                "affinity": k8s(
                    "Affinity of the gateway pods; empty: a preferred anti-affinity that "
                    "puts them on different nodes."
                ),
            },
            sizing=obj(
                "A gateway pod's computed size, used while resources is empty: a CPU "
                "request of fixedCpuMillis plus cpuPerGatewayMillis per gateway it hosts, "
                "no CPU limit, memory of fixedMemoryMi plus memoryPerGatewayMi per gateway, "
                "requested and limited alike.",
                ("fixedCpuMillis", "cpuPerGatewayMillis", "fixedMemoryMi", "memoryPerGatewayMi"),
                fixedCpuMillis=integer(
                    "Millicores for the pod's raylet and agents, Serve's proxy and HAProxy.",
                    100,
                    16_000,
                ),
                cpuPerGatewayMillis=integer("Millicores per gateway.", 100, 16_000),
                fixedMemoryMi=integer("MiB for the pod's own processes.", 256, 65_536),
                memoryPerGatewayMi=integer("MiB per gateway.", 128, 65_536),
            ),
        ),
        workerGroups={
            "type": "array",
            "minItems": 1,
            "items": _WORKER_GROUP,
            "description": "Worker groups; model replicas land where their resources fit.",
        },
    ),
    "modelStorage": obj(
        "A volume with model folders (models[].source paths point into it).",
        existingClaim=string("PersistentVolumeClaim to mount read-only; empty: none."),
        mountPath=string("Where it is mounted.", pattern="^/"),
    ),
    "modelSources": obj(
        "Models whose source is hf:// or s3://: the Secrets their credentials come from "
        "and the node cache they are fetched into.",
        secretEnv={
            "type": "array",
            "items": obj(
                "An environment variable of every Ray container, from a key of a Secret.",
                ("name", "existingSecret", "key"),
                name=string("The variable (HF_TOKEN, AWS_ACCESS_KEY_ID, ...).", pattern=ENV),
                existingSecret=string("Secret holding the value.", pattern=DNS_NAME),
                key=SECRET_KEY,
            ),
            "description": "The hub token (the variable models[].fetch.token_env names) "
            "and S3 credentials, each from a Secret you create.",
        },
        cache=obj(
            "Where remote models are fetched to (models[].fetch.cache_dir, set by the "
            "chart for a remote model that names none).",
            mountPath=string("Where every Ray container mounts the cache.", pattern="^/"),
            hostPath=string(
                "A folder on the node, shared by its Ray pods so the node fetches each "
                "model once (writable by podSecurityContext's user); empty: an emptyDir "
                "per pod.",
                pattern="^(/.*)?$",
            ),
            sizeLimit=string("The emptyDir's size limit (a quantity, e.g. 100Gi); empty: none."),
        ),
    ),
    "auth.operatorKey": obj(
        "The key that opens /metrics and the dashboard's state (client keys do not), from "
        "an existing Secret; the ServiceMonitor scrapes with it.",
        ("existingSecret", "key"),
        existingSecret=string("Secret holding the key.", pattern=DNS_NAME),
        key=SECRET_KEY,
    ),
    "auth.peerSecret": obj(
        "The key every region shares to sign its hops to peers, from an existing Secret; "
        "required when region.peers is set (the same value in every region).",
        existingSecret={**string("Secret holding the key; empty: none (no peers)."), "default": ""},
        key=SECRET_KEY,
    ),
    "auth.apiKeys": obj(
        "API keys, from an existing Secret: one file per key under the pods' secrets dir.",
        ("existingSecret", "keys"),
        existingSecret=string("Secret holding the keys.", pattern=DNS_NAME),
        keys={
            "type": "array",
            "minItems": 1,
            "items": SECRET_KEY,
            "description": "Keys of that Secret, one API key each (never sent to peer "
            "regions: forwards are signed with auth.peerSecret).",
        },
        tenants={
            "type": "object",
            "additionalProperties": {
                "type": "string",
                "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
            },
            "description": "Tenant of each key (key name -> tenant); with tenant isolation "
            "tenants share no cached prefix.",
        },
        dynamicContext={
            "type": "object",
            "additionalProperties": {
                "type": ["object", "null"],
                "properties": {
                    "default_budget_tokens": {
                        "type": ["integer", "null"],
                        "minimum": 1,
                        "maximum": 1_048_576,
                    }
                },
                "additionalProperties": False,
            },
            "description": "Keys opted in to dynamic context loading on every chat model "
            "(key name -> {default_budget_tokens}; {} for no default budget): "
            "auth.api_keys[].dynamic_context.",
        },
    ),
    "redis": obj(
        "In-chart Redis for prefix-cache hints (AUTH, no persistence: it holds hints).",
        enabled=boolean("Run Redis in the chart; false: set externalRedis."),
        image=obj(
            "Redis image.",
            ("repository", "tag"),
            repository=string("Image repository.", minLength=1),
            tag=string("Image tag (pinned).", minLength=1),
        ),
        existingSecret=string(
            "Secret holding the Redis password (you create it; the chart makes no secret, "
            "so every render is the same). Required when enabled.",
            pattern=f"^$|{DNS_NAME}",
        ),
        passwordKey=SECRET_KEY,
        tls=obj(
            "TLS only, verified by the platform and Ray's GCS against the Secret's ca.crt.",
            enabled=boolean("Serve Redis over TLS only."),
            existingSecret=string(
                "kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) for "
                "<release>-redis.<namespace>.svc, e.g. from cert-manager. Required when "
                "enabled.",
                pattern=f"^$|{DNS_NAME}",
            ),
        ),
        resources=k8s("Redis container resources."),
    ),
    "externalRedis": obj(
        "A Redis outside the chart (managed, TLS): used when redis.enabled is false.",
        url=string(
            "redis:// or rediss:// (TLS) URL, without credentials.",
            pattern="^$|^rediss?://[^\\s@]+$",
        ),
        existingSecret=SECRET_NAME,
        passwordKey=SECRET_KEY,
    ),
    "ingress": obj(
        "An Ingress for the region's public endpoint.",
        enabled=boolean("Create the Ingress."),
        className=string("IngressClass; empty: the cluster's default."),
        host=string("Public host name (<region>.llm.example.com).", pattern=f"^$|{DNS_NAME}"),
        extraHosts={
            "type": "array",
            "items": string("A host name.", pattern=DNS_NAME),
            "description": "More names served the same way (the latency-routed domain).",
        },
        annotations=string_map("Ingress annotations (e.g. proxy timeouts for streaming)."),
        tls=obj(
            "TLS termination at the ingress.",
            enabled=boolean("Serve HTTPS with the certificate in secretName."),
            secretName=string("TLS Secret; empty: <fullname>-tls."),
            clusterIssuer=string("cert-manager ClusterIssuer that issues it; empty: none."),
        ),
        exposeOperatorPaths=boolean("Also route /dashboard and /metrics (default: API only)."),
    ),
    "httpRoute": obj(
        "A Gateway API HTTPRoute, the alternative to the Ingress.",
        enabled=boolean("Create the HTTPRoute."),
        parentRefs=k8s("Gateways to attach to ([{name, namespace, sectionName}]).", "array"),
        hostnames={"type": "array", "items": {"type": "string"}, "description": "Host names."},
        exposeOperatorPaths=boolean("Also route /dashboard and /metrics (default: API only)."),
    ),
    "monitoring": obj(
        "Prometheus Operator and Grafana objects.",
        assumePrometheusOperator=boolean(
            "Render ServiceMonitor, PrometheusRule and PodMonitor even where the cluster "
            "does not advertise monitoring.coreos.com/v1 (offline renders)."
        ),
        serviceMonitor=obj(
            "Scrape the gateway's /metrics.",
            enabled=boolean("Create the ServiceMonitor where the cluster serves its kind."),
            interval=string("Scrape interval.", pattern=DURATION),
            labels=string_map("Labels your Prometheus selects ServiceMonitors by."),
        ),
        prometheusRule=obj(
            "The alert rules (TTFT/TPOT above SLO, errors, no healthy replica, ...).",
            enabled=boolean("Create the PrometheusRule."),
            labels=string_map("Labels your Prometheus selects rules by."),
        ),
        grafanaDashboards=obj(
            "Dashboard ConfigMaps for the Grafana sidecar.",
            enabled=boolean("Create the ConfigMaps."),
            labels=string_map("Labels the sidecar watches (grafana_dashboard: '1')."),
            annotations=string_map("Annotations, e.g. the sidecar's folder annotation."),
        ),
        enginePodMonitor=pod_monitor(
            "Scrape vLLM's own metrics (vllm:*) of every model replica from Ray's metrics "
            "agent (port 8080 of every Ray pod), renamed to vLLM's names."
        ),
        rayPodMonitor=pod_monitor(
            "Scrape Ray's own metrics (port 8080 of every Ray pod; vLLM's are the engine "
            "PodMonitor's)."
        ),
    ),
    "networkPolicy": obj(
        "Only the gateway port is reachable from outside; Redis only from the Ray pods.",
        enabled=boolean("Create the NetworkPolicies."),
        kubeRayOperator=k8s(
            "NetworkPolicyPeer of the KubeRay operator (reads the dashboard, which runs "
            "jobs): a namespaceSelector naming its namespace, or none for this namespace; "
            "an empty one (every namespace) is refused."
        ),
        metricsFrom=k8s("NetworkPolicyPeers allowed to scrape Ray's metrics port.", "array"),
        egress=obj(
            "What the Ray pods may connect to.",
            enabled=boolean(
                "Restrict the Ray pods' egress to the release's pods, Redis, DNS and `to`."
            ),
            dns=k8s("NetworkPolicyPeer of the cluster's DNS (port 53, UDP and TCP)."),
            to=k8s("NetworkPolicyEgressRules allowed besides those.", "array"),
        ),
    ),
    "podDisruptionBudget": obj(
        "PodDisruptionBudgets of the worker groups: drains keep minAvailable worker pods "
        "of a group; only groups whose minReplicas is above it get one.",
        enabled=boolean("Create one per worker group that can keep minAvailable pods."),
        minAvailable=integer("Worker pods of a group a voluntary eviction must leave.", 1, 1000),
    ),
    "tests": obj(
        "The `helm test` pod: /readyz, then one completion with the first API key.",
        enabled=boolean("Create the test pod."),
        model=string("Model to ask; empty: the first of models."),
    ),
}
"""Chart sections by value path; ``auth.apiKeys`` is spliced into the auth section."""
