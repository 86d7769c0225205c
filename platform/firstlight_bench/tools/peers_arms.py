"""The arms of ``firstlight bench peers``: each way of serving the model it compares, as
one object that takes a request and returns what the client saw — Firstlight's vLLM
adapter in process, vLLM's own OpenAI server in a subprocess, Ray Serve LLM's OpenAI
application and one Firstlight region (both in one local Ray cluster) — and the
platform configuration the Firstlight arm runs.

Called by :mod:`firstlight_bench.tools.peers` and by ``firstlight bench features``
(:mod:`firstlight_bench.tools.features`), which starts the same servers.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from firstlight._ports import free_port
from firstlight.api.prompts import PromptEncoder
from firstlight.api.schemas import ChatMessage
from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.engine.protocol import Engine, GenerationRequest, SamplingSettings
from firstlight_bench.reports.peers_report import timed
from firstlight_bench.reports.results import Outcome

__all__ = ["MODEL", "Arm", "EngineArm", "OpenAIArm", "platform_config", "ray_arms", "vllm_server"]

MODEL = "SmolLM2-135M-Instruct"
"""The served model name every arm answers to (also used by ``firstlight bench features``)."""
_REGION = "peers"
_RAY_LLM_APP = "ray-serve-llm"
_START_TIMEOUT_S = 600.0
_REQUEST_TIMEOUT_S = 120.0


class Arm(Protocol):
    """One way of serving the model: one request in, what the client saw out."""

    async def request(self, message: str, max_tokens: int) -> Outcome: ...


class OpenAIArm:
    """An OpenAI-compatible HTTP endpoint, driven by the official ``openai`` client."""

    def __init__(self, base_url: str, model: str) -> None:
        import openai

        self.base_url = base_url
        """The endpoint's OpenAI base URL (``.../v1``)."""
        self._openai = openai
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key="peers", max_retries=0, timeout=_REQUEST_TIMEOUT_S
        )
        self._model = model

    async def request(self, message: str, max_tokens: int) -> Outcome:
        start = time.perf_counter()
        first: float | None = None
        tokens, rid = 0, ""
        try:
            stream = await self._client.chat.completions.create(
                model=self._model,
                messages=[{"role": "user", "content": message}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                rid = rid or chunk.id
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
        except self._openai.OpenAIError as exc:
            return Outcome(rid, start, None, None, error=f"{type(exc).__name__}: {exc}")
        return timed(rid, start, first, time.perf_counter(), tokens)

    async def close(self) -> None:
        await self._client.close()


class EngineArm:
    """The engine in this process through Firstlight's adapter; prompts are encoded by
    the gateway's own prompt encoder (the chat template) before the clock starts."""

    def __init__(self, engine: Engine, encoder: PromptEncoder) -> None:
        self._engine = engine
        self._encoder = encoder
        self._count = 0

    async def request(self, message: str, max_tokens: int) -> Outcome:
        ids = self._encoder.chat([ChatMessage(role="user", content=message)])
        self._count += 1
        request = GenerationRequest(
            f"peers-engine-{self._count}", ids, SamplingSettings(max_tokens)
        )
        start = time.perf_counter()
        first: float | None = None
        tokens = 0
        async for chunk in self._engine.generate(request):
            if first is None and chunk.text:
                first = time.perf_counter()
            tokens += len(chunk.token_ids)
        return timed(request.request_id, start, first, time.perf_counter(), tokens)


def platform_config(port: int, cache_dir: Path | None, stream_interval: int) -> PlatformConfig:
    """The one-region local platform every arm is configured from: the default model on
    vLLM (float32, eager, block size 32, prefix caching, 1 GiB of KV cache, one replica),
    the gateway on ``127.0.0.1:port``, auth off. Called by :func:`peers` and by
    ``firstlight bench features``; raises ``ConfigError`` for a bad ``cache_dir``."""
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": _REGION, "peers": []}],
        "models": [
            {
                "name": MODEL,
                "source": "default",
                "engine": "vllm",
                "dtype": "float32",
                "max_model_len": 2048,
                "block_size": 32,
                "enable_prefix_caching": True,
                "enforce_eager": True,
                "stream_interval_tokens": stream_interval,
                "kv_cache_gib": 1,
                "replicas": 1,
                "resources": {"num_cpus": 0},
            }
        ],
        "auth": {"enabled": False},
        "gateway": {"host": "127.0.0.1", "port": port},
        "hints": {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": "firstlight:peers:"},
    }
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    return parse_config(data, "firstlight bench peers")


def _wait_http(url: str, what: str, process: subprocess.Popen[bytes] | None, log: Path) -> None:
    """Poll ``url`` until it answers 200; raise ``RuntimeError`` (with the log's tail) when
    ``process`` exits first or nothing answers within the start-up time-out."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return
            time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"{what} did not become ready at {url}; its log ends:\n{tail}")


@contextlib.contextmanager
def vllm_server(
    model_dir: Path, model: ModelConfig, dtype: str, logs: Path, extra_args: Sequence[str] = ()
) -> Iterator[OpenAIArm]:
    """A raw vLLM OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on
    ``model_dir`` in a subprocess, with ``extra_args`` appended to its command line; its
    log is ``logs/vllm-server.log``. Yields its arm once ``/health`` answers, terminates it
    on exit; raises ``RuntimeError`` when it does not start. Used by :func:`peers`
    and by ``firstlight bench features`` (which adds tool-call options)."""
    port = free_port()
    log = logs / "vllm-server.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", str(model_dir), "--served-model-name", MODEL, "--dtype", dtype]
    command += ["--max-model-len", "2048", "--block-size", "32", "--enforce-eager"]
    command += ["--enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--stream-interval", str(model.stream_interval_tokens), *extra_args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", "the raw vLLM server", process, log)
        yield OpenAIArm(f"http://127.0.0.1:{port}/v1", MODEL)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ray_serve_llm_app(model_dir: Path, model: ModelConfig, dtype: str) -> Any:
    from ray.serve.llm import LLMConfig, build_openai_app
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    config = LLMConfig(
        model_loading_config={"model_id": MODEL, "model_source": str(model_dir)},
        accelerator_config={"kind": "cpu"},
        engine_kwargs={
            "dtype": dtype,
            "enforce_eager": True,
            "max_model_len": 2048,
            "block_size": 32,
            "enable_prefix_caching": True,
            "stream_interval": model.stream_interval_tokens,
        },
        deployment_config={
            "num_replicas": 1,
            "request_router_config": {"request_router_class": PrefixCacheAffinityRouter},
        },
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}},
    )
    return build_openai_app({"llm_configs": [config]})


@contextlib.contextmanager
def ray_arms(config: PlatformConfig, model_dir: Path, dtype: str, wanted: Sequence[str],
             logs: Path) -> Iterator[dict[str, OpenAIArm]]:  # fmt: skip
    """The Ray arms among ``wanted`` (``ray_serve_llm``, ``firstlight``) in one local Ray
    cluster that this starts and shuts down on exit; yields them by name once each
    answers. Used by :func:`peers` and by ``firstlight bench features``; raises
    ``StartupError`` or ``RuntimeError`` when an arm does not start."""
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from firstlight.serve.data_plane import prepare_local_ray
    from firstlight.serve.local_mode import start_local

    prepare_local_ray(config.gateway)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        port = config.gateway.port
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        arms: dict[str, OpenAIArm] = {}
        if "ray_serve_llm" in wanted:  # deploys while Firstlight's region starts
            target = RunTarget(
                _ray_serve_llm_app(model_dir, config.models[0], dtype),
                _RAY_LLM_APP,
                f"/{_RAY_LLM_APP}",
            )
            serve.run_many([target], wait_for_applications_running=False)
        if "firstlight" in wanted:
            running = start_local(config, timeout_s=_START_TIMEOUT_S)
            arms["firstlight"] = OpenAIArm(f"{running.endpoints[_REGION]}/v1", MODEL)
        if "ray_serve_llm" in wanted:
            base = f"http://127.0.0.1:{port}/{_RAY_LLM_APP}"
            _wait_http(f"{base}/v1/models", "Ray Serve LLM", None, logs / "none")
            arms["ray_serve_llm"] = OpenAIArm(f"{base}/v1", MODEL)
        yield arms
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
