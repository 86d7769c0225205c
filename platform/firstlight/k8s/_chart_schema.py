"""JSON schemas of the chart's own (camelCase) value sections.

Read by :func:`firstlight.k8s.values_schema.values_schema`, which joins them with the
config sections generated from ``PlatformConfig``. Sections made of our own keys reject
unknown keys (a typo fails ``helm install`` instead of being ignored); Kubernetes
objects passed through verbatim (resources, tolerations, affinity, annotations) are
checked only for their JSON type.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHART_SECTIONS"]

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_NAME = "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_DURATION = "^[0-9]+(ms|s|m|h)$"
_ENV = "^[A-Za-z_][A-Za-z0-9_]*$"


def _obj(description: str, required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "description": description,
        "properties": properties,
    }
    if required:
        out["required"] = list(required)
    return out


def _str(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _bool(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def _int(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": description}


def _map(description: str) -> dict[str, Any]:
    """Labels, annotations, node selectors: string to string."""
    return {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": description,
    }


def _k8s(description: str, kind: str = "object") -> dict[str, Any]:
    """A Kubernetes structure passed through as is (validated by the API server)."""
    return {"type": kind, "description": description}


def _pod_monitor(description: str) -> dict[str, Any]:
    return _obj(
        description,
        enabled=_bool("Create the PodMonitor where the cluster serves its kind."),
        interval=_str("Scrape interval.", pattern=_DURATION),
        labels=_map("Labels your Prometheus selects PodMonitors by."),
    )


def _placement(what: str) -> dict[str, Any]:
    return {
        "resources": _k8s(f"Container resources of {what} (requests/limits)."),
        "nodeSelector": _map(f"Node labels {what} must run on."),
        "tolerations": _k8s(f"Tolerations of {what}.", "array"),
        "affinity": _k8s(f"Affinity of {what}."),
    }


_SECRET_NAME = _str("Name of an existing Secret.", pattern=f"^$|{_DNS_NAME}")
_SECRET_KEY = _str("Key in that Secret.", pattern="^[-._a-zA-Z0-9]+$")

_WORKER_GROUP = _obj(
    "A group of Ray worker pods (one accelerator type).",
    ("name", "minReplicas", "maxReplicas"),
    name=_str(
        "Worker group name (Ray's groupName); not gateways, the gateway pods' group.",
        pattern=_DNS_LABEL,
    ),
    replicas=_int("Pods at install time (the autoscaler then moves it).", 0, 1000),
    minReplicas=_int("Fewest pods the Ray autoscaler keeps (0 scales to zero).", 0, 1000),
    maxReplicas=_int("Most pods the Ray autoscaler may start.", 0, 1000),
    gpus=_int("GPUs per pod (nvidia.com/gpu); 0 for a CPU group.", 0, 16),
    **_placement("this group's pods"),
)

CHART_SECTIONS: dict[str, dict[str, Any]] = {
    "global": _k8s(
        "What an umbrella chart shares with its subcharts (Helm's `global`); this chart "
        "reads none of it, but takes it, so it can be a subchart."
    ),
    "podSecurityContext": _k8s(
        "Security context of every Ray pod (null a key to drop it, e.g. runAsUser where "
        "the platform assigns users)."
    ),
    "containerSecurityContext": _k8s("Security context of every Ray container."),
    "serviceAccount": _obj(
        "The Ray pods' service account.",
        name=_str("Service account name; empty: the namespace's default."),
        automountToken=_bool("Mount the service account's token in the Ray pods."),
    ),
    "priorityClassName": _str("PriorityClass of the Ray pods; empty: none."),
    "topologySpreadConstraints": _k8s("Topology spread constraints of every Ray pod.", "array"),
    "extraVolumes": _k8s("Extra volumes of every Ray pod.", "array"),
    "extraVolumeMounts": _k8s("Where every Ray container mounts the extra volumes.", "array"),
    "nameOverride": _str("Replaces the chart name in resource names.", maxLength=40),
    "fullnameOverride": _str("Replaces release-chart in resource names.", maxLength=40),
    "image": _obj(
        "Firstlight's container image (the repository's Dockerfile).",
        ("repository",),
        repository=_str("Image repository.", minLength=1),
        tag=_str("Image tag; empty: the chart's appVersion (GPU build)."),
        digest=_str(
            "Image digest (sha256:...); set, the pods run repository@digest and the tag "
            "is ignored: the exact image, whatever the tag points to later.",
            pattern="^(sha256:[a-f0-9]{64})?$",
        ),
        pullPolicy={"enum": ["Always", "IfNotPresent", "Never"], "description": "Pull policy."},
    ),
    "imagePullSecrets": _k8s("Secrets for pulling the image ([{name: ...}]).", "array"),
    "podLabels": _map("Extra labels on every pod."),
    "podAnnotations": _map("Extra annotations on every pod."),
    "extraEnv": _k8s("Extra environment variables (Kubernetes EnvVar list) on Ray pods.", "array"),
    "rayCluster": _obj(
        "The RayService's Ray cluster: a CPU-only head, the CPU-only gateway pods and "
        "accelerator worker groups.",
        ("head", "gateways", "workerGroups"),
        rayVersion=_str("Ray version in the image (KubeRay uses it for compatibility)."),
        upgradeStrategy=_str(
            "On a Ray cluster change: NewCluster (a new cluster, traffic moves when it "
            "serves) or None (the running cluster is left as it is).",
            pattern="^(NewCluster|None)$",
        ),
        gcsFaultTolerance=_obj(
            "GCS fault tolerance: the head's metadata in the region's Redis, so a head "
            "restart keeps the workers and their replicas.",
            enabled=_bool("Use the region's Redis (redis or externalRedis) for the GCS."),
        ),
        autoscaling=_obj(
            "Ray's in-tree autoscaler.",
            enabled=_bool("Scale worker groups between minReplicas and maxReplicas."),
            idleTimeoutSeconds=_int("Seconds an idle worker lives before removal.", 1, 86400),
        ),
        head=_obj(
            "The head pod (Ray's core, the Serve controller, Serve's proxy and HAProxy out "
            "of the serve Service; no model, no gateway): a fixed size, whatever "
            "gateway.replicas.",
            **_placement("the head pod"),
        ),
        gateways=_obj(
            "The gateway pods: a CPU-only worker group (groupName gateways) running every "
            "gateway replica and nothing else; gateway.replicas / gatewaysPerPod pods, "
            "rounded up, at least two from two gateways.",
            ("gatewaysPerPod", "sizing"),
            gatewaysPerPod=_int(
                "Gateways one pod hosts at most (the firstlight_gateway units it advertises).",
                1,
                8,
            ),
            **{
                **_placement("a gateway pod"),
                "resources": _k8s(
                    "Container resources of a gateway pod (requests/limits), used as they "
                    "are; empty: computed by sizing."
                ),
                "affinity": _k8s(
                    "Affinity of the gateway pods; empty: a preferred anti-affinity that "
                    "puts them on different nodes."
                ),
            },
            sizing=_obj(
                "A gateway pod's computed size, used while resources is empty: a CPU "
                "request of fixedCpuMillis plus cpuPerGatewayMillis per gateway it hosts, "
                "no CPU limit, memory of fixedMemoryMi plus memoryPerGatewayMi per gateway, "
                "requested and limited alike.",
                ("fixedCpuMillis", "cpuPerGatewayMillis", "fixedMemoryMi", "memoryPerGatewayMi"),
                fixedCpuMillis=_int(
                    "Millicores for the pod's raylet and agents, Serve's proxy and HAProxy.",
                    100,
                    16_000,
                ),
                cpuPerGatewayMillis=_int("Millicores per gateway.", 100, 16_000),
                fixedMemoryMi=_int("MiB for the pod's own processes.", 256, 65_536),
                memoryPerGatewayMi=_int("MiB per gateway.", 128, 65_536),
            ),
        ),
        workerGroups={
            "type": "array",
            "minItems": 1,
            "items": _WORKER_GROUP,
            "description": "Worker groups; model replicas land where their resources fit.",
        },
    ),
    "modelStorage": _obj(
        "A volume with model folders (models[].source paths point into it).",
        existingClaim=_str("PersistentVolumeClaim to mount read-only; empty: none."),
        mountPath=_str("Where it is mounted.", pattern="^/"),
    ),
    "modelSources": _obj(
        "Models whose source is hf:// or s3://: the Secrets their credentials come from "
        "and the node cache they are fetched into.",
        secretEnv={
            "type": "array",
            "items": _obj(
                "An environment variable of every Ray container, from a key of a Secret.",
                ("name", "existingSecret", "key"),
                name=_str("The variable (HF_TOKEN, AWS_ACCESS_KEY_ID, ...).", pattern=_ENV),
                existingSecret=_str("Secret holding the value.", pattern=_DNS_NAME),
                key=_SECRET_KEY,
            ),
            "description": "The hub token (the variable models[].fetch.token_env names) "
            "and S3 credentials, each from a Secret you create.",
        },
        cache=_obj(
            "Where remote models are fetched to (models[].fetch.cache_dir, set by the "
            "chart for a remote model that names none).",
            mountPath=_str("Where every Ray container mounts the cache.", pattern="^/"),
            hostPath=_str(
                "A folder on the node, shared by its Ray pods so the node fetches each "
                "model once (writable by podSecurityContext's user); empty: an emptyDir "
                "per pod.",
                pattern="^(/.*)?$",
            ),
            sizeLimit=_str("The emptyDir's size limit (a quantity, e.g. 100Gi); empty: none."),
        ),
    ),
    "auth.operatorKey": _obj(
        "The key that opens /metrics and the dashboard's state (client keys do not), from "
        "an existing Secret; the ServiceMonitor scrapes with it.",
        ("existingSecret", "key"),
        existingSecret=_str("Secret holding the key.", pattern=_DNS_NAME),
        key=_SECRET_KEY,
    ),
    "auth.peerSecret": _obj(
        "The key every region shares to sign its hops to peers, from an existing Secret; "
        "required when region.peers is set (the same value in every region).",
        existingSecret={**_str("Secret holding the key; empty: none (no peers)."), "default": ""},
        key=_SECRET_KEY,
    ),
    "auth.apiKeys": _obj(
        "API keys, from an existing Secret: one file per key under the pods' secrets dir.",
        ("existingSecret", "keys"),
        existingSecret=_str("Secret holding the keys.", pattern=_DNS_NAME),
        keys={
            "type": "array",
            "minItems": 1,
            "items": _SECRET_KEY,
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
    "redis": _obj(
        "In-chart Redis for prefix-cache hints (AUTH, no persistence: it holds hints).",
        enabled=_bool("Run Redis in the chart; false: set externalRedis."),
        image=_obj(
            "Redis image.",
            ("repository", "tag"),
            repository=_str("Image repository.", minLength=1),
            tag=_str("Image tag (pinned).", minLength=1),
        ),
        existingSecret=_str(
            "Secret holding the Redis password (you create it; the chart makes no secret, "
            "so every render is the same). Required when enabled.",
            pattern=f"^$|{_DNS_NAME}",
        ),
        passwordKey=_SECRET_KEY,
        tls=_obj(
            "TLS only, verified by the platform and Ray's GCS against the Secret's ca.crt.",
            enabled=_bool("Serve Redis over TLS only."),
            existingSecret=_str(
                "kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) for "
                "<release>-redis.<namespace>.svc, e.g. from cert-manager. Required when "
                "enabled.",
                pattern=f"^$|{_DNS_NAME}",
            ),
        ),
        resources=_k8s("Redis container resources."),
    ),
    "externalRedis": _obj(
        "A Redis outside the chart (managed, TLS): used when redis.enabled is false.",
        url=_str(
            "redis:// or rediss:// (TLS) URL, without credentials.",
            pattern="^$|^rediss?://[^\\s@]+$",
        ),
        existingSecret=_SECRET_NAME,
        passwordKey=_SECRET_KEY,
    ),
    "ingress": _obj(
        "An Ingress for the region's public endpoint.",
        enabled=_bool("Create the Ingress."),
        className=_str("IngressClass; empty: the cluster's default."),
        host=_str("Public host name (<region>.llm.example.com).", pattern=f"^$|{_DNS_NAME}"),
        extraHosts={
            "type": "array",
            "items": _str("A host name.", pattern=_DNS_NAME),
            "description": "More names served the same way (the latency-routed domain).",
        },
        annotations=_map("Ingress annotations (e.g. proxy timeouts for streaming)."),
        tls=_obj(
            "TLS termination at the ingress.",
            enabled=_bool("Serve HTTPS with the certificate in secretName."),
            secretName=_str("TLS Secret; empty: <fullname>-tls."),
            clusterIssuer=_str("cert-manager ClusterIssuer that issues it; empty: none."),
        ),
        exposeOperatorPaths=_bool("Also route /dashboard and /metrics (default: API only)."),
    ),
    "httpRoute": _obj(
        "A Gateway API HTTPRoute, the alternative to the Ingress.",
        enabled=_bool("Create the HTTPRoute."),
        parentRefs=_k8s("Gateways to attach to ([{name, namespace, sectionName}]).", "array"),
        hostnames={"type": "array", "items": {"type": "string"}, "description": "Host names."},
        exposeOperatorPaths=_bool("Also route /dashboard and /metrics (default: API only)."),
    ),
    "monitoring": _obj(
        "Prometheus Operator and Grafana objects.",
        assumePrometheusOperator=_bool(
            "Render ServiceMonitor, PrometheusRule and PodMonitor even where the cluster "
            "does not advertise monitoring.coreos.com/v1 (offline renders)."
        ),
        serviceMonitor=_obj(
            "Scrape the gateway's /metrics.",
            enabled=_bool("Create the ServiceMonitor where the cluster serves its kind."),
            interval=_str("Scrape interval.", pattern=_DURATION),
            labels=_map("Labels your Prometheus selects ServiceMonitors by."),
        ),
        prometheusRule=_obj(
            "The alert rules (TTFT/TPOT above SLO, errors, no healthy replica, ...).",
            enabled=_bool("Create the PrometheusRule."),
            labels=_map("Labels your Prometheus selects rules by."),
        ),
        grafanaDashboards=_obj(
            "Dashboard ConfigMaps for the Grafana sidecar.",
            enabled=_bool("Create the ConfigMaps."),
            labels=_map("Labels the sidecar watches (grafana_dashboard: '1')."),
            annotations=_map("Annotations, e.g. the sidecar's folder annotation."),
        ),
        enginePodMonitor=_pod_monitor(
            "Scrape vLLM's own metrics (vllm:*) of every model replica from Ray's metrics "
            "agent (port 8080 of every Ray pod), renamed to vLLM's names."
        ),
        rayPodMonitor=_pod_monitor(
            "Scrape Ray's own metrics (port 8080 of every Ray pod; vLLM's are the engine "
            "PodMonitor's)."
        ),
    ),
    "networkPolicy": _obj(
        "Only the gateway port is reachable from outside; Redis only from the Ray pods.",
        enabled=_bool("Create the NetworkPolicies."),
        kubeRayOperator=_k8s(
            "NetworkPolicyPeer of the KubeRay operator (reads the dashboard, which runs "
            "jobs): a namespaceSelector naming its namespace, or none for this namespace; "
            "an empty one (every namespace) is refused."
        ),
        metricsFrom=_k8s("NetworkPolicyPeers allowed to scrape Ray's metrics port.", "array"),
        egress=_obj(
            "What the Ray pods may connect to.",
            enabled=_bool(
                "Restrict the Ray pods' egress to the release's pods, Redis, DNS and `to`."
            ),
            dns=_k8s("NetworkPolicyPeer of the cluster's DNS (port 53, UDP and TCP)."),
            to=_k8s("NetworkPolicyEgressRules allowed besides those.", "array"),
        ),
    ),
    "podDisruptionBudget": _obj(
        "PodDisruptionBudgets of the worker groups: drains keep minAvailable worker pods "
        "of a group; only groups whose minReplicas is above it get one.",
        enabled=_bool("Create one per worker group that can keep minAvailable pods."),
        minAvailable=_int("Worker pods of a group a voluntary eviction must leave.", 1, 1000),
    ),
    "tests": _obj(
        "The `helm test` pod: /readyz, then one completion with the first API key.",
        enabled=_bool("Create the test pod."),
        model=_str("Model to ask; empty: the first of models."),
    ),
}
"""Chart sections by value path; ``auth.apiKeys`` is spliced into the auth section."""
