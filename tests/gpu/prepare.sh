#!/usr/bin/env bash
# Run HERE (a machine with the package registries) before a device check: gathers what a bare GPU machine
# lacks into .device/ (git-ignored; carried with the run), small enough for the 64 MiB transfer limit:
#   .device/wheels  Python 3.12 wheels of agentrl's dependencies the GPU image does not have
#   .device/debs    bubblewrap (the local sandbox), unpacked there with dpkg -x
#   .device/cache   the SmolLM2 tokenizer (no weights: 98 MB would not travel), as AGENTRL_CACHE
# Then: device run with carry [".device"] and command `bash tests/gpu/device_check.sh` (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .device/wheels .device/debs .device/cache
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>"$(git rev-parse --git-common-dir)/info/exclude"
# The GPU image (docs/gpu.md) has torch, transformers, numpy, pytest, httpx, anyio...; not these.
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  -d .device/wheels gymnasium pytest-asyncio openai starlette uvicorn httptools 2>&1 | grep -v "is ignored" || true
( cd .device/wheels && rm -f numpy-* pytest-[0-9]* pluggy-* iniconfig-* packaging-* pygments-* idna-* \
  click-* cloudpickle-* h11-* certifi-* tqdm-* )
( cd .device/debs && apt-get download bubblewrap libcap2 2>/dev/null ) || echo "warning: no bubblewrap .deb"
tok=$("$PY" -c "from agentrl.models import smollm2_dir; print(smollm2_dir())")
rm -rf .device/cache/"$(basename "$tok")" && mkdir -p .device/cache/"$(basename "$tok")"
cp "$tok"/{.agentrl-complete,chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
  .device/cache/"$(basename "$tok")"/
du -sh .device
