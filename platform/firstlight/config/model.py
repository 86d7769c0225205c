"""A served model's section: engine, weights, dtype, quantization, speculative decoding,
prefix caching, KV cache and resources (:class:`ModelConfig`)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from firstlight.config._base import FieldValueError, Section

__all__ = [
    "DEFAULT_MODEL_NAME",
    "Dtype",
    "EngineName",
    "ModelConfig",
    "Quantization",
    "ResourcesConfig",
    "SpeculativeConfig",
    "SpeculativeMethod",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
EngineName = Literal["vllm", "sim"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
"""A model's weight and activation dtype (``auto``: the engine decides)."""
Quantization = Literal["awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes"]
SpeculativeMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]


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


class ModelConfig(Section):
    """A model served in every region, with its engine settings."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
    """Name clients pass as ``model`` in OpenAI requests."""
    source: Annotated[str, Field(min_length=1)] = "default"
    """``default`` for SmolLM2-135M-Instruct prepared by ``firstlight prepare-model``,
    ``default-int8`` for its INT8 W8A8 variant (``prepare-model --quantize int8``; set
    ``quantization: compressed-tensors``), otherwise a local Hugging Face model folder
    (nothing is downloaded at run time)."""
    engine: EngineName = "vllm"
    """``vllm`` (real engine, CPU or GPU) or ``sim`` (simulator, results labelled
    simulated)."""
    sim_profile: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{0,63}$")] = "cpu-smollm2-135m"
    """Simulator profile of an ``engine: sim`` model: ``cpu-smollm2-135m`` (the default
    model on a CPU), ``h100-llama-8b`` or ``instant`` (near-zero cost, for measuring the
    platform's own overhead). Ignored by ``vllm``."""
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
    """KV-cache size per replica in GiB; ``null`` keeps the engine's default."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding settings; ``null`` turns it off."""
    tool_call_parser: Annotated[str | None, Field(pattern=r"^[a-z0-9_]{1,64}$")] = None
    """vLLM's tool-call parser for this model's chat template (``hermes``,
    ``llama3_json``, ``mistral``, ...): turns on ``tool_choice`` ``auto``, ``required``
    and a named function, as vLLM's ``--enable-auto-tool-choice --tool-call-parser``.
    ``null``: requests with ``tools`` get vLLM's own answer without a parser. Ignored by
    ``sim``."""
    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    """Replicas of this model in each region."""
    resources: ResourcesConfig = ResourcesConfig()
    """Resources reserved per replica."""
