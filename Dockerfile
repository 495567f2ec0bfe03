# The image every CoEvolve service runs from: `coevolve <service>` picks the part.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY services services
COPY streams streams
RUN pip install --no-cache-dir . \
 && pip install --no-cache-dir --no-deps 'bfcl-eval==2026.3.23'
USER 65534:65534
ENTRYPOINT ["coevolve"]
