# EAGLE_TRITON on the official SGLang image of the pinned SGLang release (no fork, no rebuild of SGLang).
#   docker build -t sgl-eagle-triton .
#   docker run --gpus all -p 30000:30000 -v /path/to/models:/models sgl-eagle-triton
# MODEL_PATH / DRAFT_MODEL_PATH / PORT / EXTRA_ARGS select the models, port and further server flags.
ARG SGLANG_VERSION=0.5.17
ARG SGLANG_IMAGE=lmsysorg/sglang:v${SGLANG_VERSION}-cu130
FROM ${SGLANG_IMAGE}
ARG SGLANG_VERSION

WORKDIR /opt/sgl-eagle-triton
COPY pyproject.toml README.md ./
COPY sgl_eagle_triton ./sgl_eagle_triton
RUN python3 -m pip install --no-cache-dir --no-deps . \
    && python3 -c "import sglang, sys; sys.exit(sglang.__version__ != '${SGLANG_VERSION}')"

ENV MODEL_PATH=/models/target \
    DRAFT_MODEL_PATH=/models/draft \
    PORT=30000 \
    EXTRA_ARGS=""
EXPOSE 30000
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["sh", "-c", "curl -fsS http://localhost:$PORT/health || exit 1"]
CMD ["sh", "-c", "exec python3 -m sglang.launch_server --host 0.0.0.0 --port $PORT --model-path $MODEL_PATH --speculative-algorithm EAGLE_TRITON --speculative-draft-model-path $DRAFT_MODEL_PATH $EXTRA_ARGS"]
