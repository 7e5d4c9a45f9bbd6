#!/usr/bin/env bash
# Install attngeom as of one commit into a folder of its own, so that a long study keeps running
# that code while the working tree changes (each layer or step of a study is a fresh `attngeom`
# process, which otherwise imports the tree as it is when it starts).
# Usage: studies/pin_code.sh [COMMIT] [DIR]   (defaults: HEAD, /tmp/attngeom-pinned-COMMIT)
#   then: PYTHONPATH=DIR studies/MODEL/run_faithfulness.sh ...   (DIR/COMMIT names the commit)
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short "${1:-HEAD}")
dir=${2:-/tmp/attngeom-pinned-$commit}
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive "$commit" | tar -x -C "$src"
rm -rf "$dir"
.venv/bin/pip install -q --no-deps --no-build-isolation --target "$dir" "$src"
echo "$commit" > "$dir/COMMIT"
echo "PYTHONPATH=$dir"
