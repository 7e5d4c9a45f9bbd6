#!/usr/bin/env bash
# The peers' own environments, beside their scripts and never attngeom's (git-ignored):
#   .venv        torch, transformers, TransformerLens, nnsight (and the plain script)
#   .venv-inseq  torch, transformers, inseq: inseq pins typeguard<=2.13.3, TransformerLens
#                needs typeguard>=4.2, so they cannot share one environment
# torch is installed first, at attngeom's version and as its CPU build (TORCH, as in the
# Makefile), so that no peer's requirement brings in another torch; the script fails if a
# CUDA build came in anyway. Versions are pinned: the figures name them.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}

make_env() {                      # make_env DIR PACKAGE...
    local dir=$1; shift
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
    "$dir/bin/python" -m pip install -q "$TORCH"
    "$dir/bin/python" -m pip install -q "$TORCH" "$@"
    "$dir/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' || {
        echo "$dir: a CUDA build of torch was installed; install the CPU build first" >&2
        exit 1; }
}

make_env .venv transformer-lens==4.3.0 nnsight==0.8.1
make_env .venv-inseq inseq==0.7.1
.venv/bin/python -c 'import torch, transformers
print("peers installed: torch", torch.__version__, "transformers", transformers.__version__)'
