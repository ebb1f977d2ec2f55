#!/usr/bin/env bash
# Runs ON the GPU machine, from the repo root there, after every piece .dev/partNN has been
# copied to /root/st (docs/gpu.md, "How to reproduce"). Joins the pieces, installs vLLM 0.26.0 and the
# packages the image lacks into /tmp/site once, adds the project's own missing wheels
# (.whl/: hdrhistogram, orjson, pbr) when they travelled, and checks that vLLM imports.
# Afterwards: export PYTHONPATH=/tmp/site:$PWD
set -u
ROOT=$PWD
if [ ! -d /tmp/site/vllm ]; then
  (cd /root/st && cat part* > all.tar && mkdir -p w && tar xf all.tar -C w && rm all.tar &&
   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
     w/*.whl 2>&1 | grep -v WARNING | tail -5)
fi
if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/hdrh ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$ROOT"/.whl/*.whl 2>&1 | grep -v WARNING | tail -5
fi
export PYTHONPATH=/tmp/site:$ROOT
python3 -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__, 'imports ok')"
python3 -c "import hdrh, orjson, agent_replay.replay; print('agent-replay imports ok')"
