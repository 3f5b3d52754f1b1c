#!/usr/bin/env bash
# Builds {{name}}.wasm from src/app.py with componentize-py, for the world `{{world}}` of
# wit/. On first use (and when requirements.txt changes) it installs the pinned
# componentize-py into .venv/ (needs python3 >= 3.10 with venv); VVM_COMPONENTIZE_PY names an
# installed componentize-py to use instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
componentize="${VVM_COMPONENTIZE_PY:-}"
if [[ -z "$componentize" ]]; then
    venv="$here/.venv"
    if [[ ! -e "$venv/.installed" || "$here/requirements.txt" -nt "$venv/.installed" ]]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
        touch "$venv/.installed"
    fi
    componentize="$venv/bin/componentize-py"
fi
"$componentize" --quiet -d "$here/wit" -w {{world}} componentize -p "$here/src" app \
    -o "$here/{{name}}.wasm"
echo "built $here/{{name}}.wasm"
