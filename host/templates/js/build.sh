#!/usr/bin/env bash
# Builds {{name}}.wasm from app.js with componentize-js, for the world `{{world}}` of wit/.
# On first use (and when package.json changes) it installs the pinned componentize-js into
# node_modules/ (needs node >= 18 with npm); VVM_NODE_MODULES names a node_modules folder
# that has it, to use instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
modules="${VVM_NODE_MODULES:-}"
if [[ -z "$modules" ]]; then
    modules="$here/node_modules"
    if [[ ! -e "$modules/.installed" || "$here/package.json" -nt "$modules/.installed" ]]; then
        (cd "$here" && npm install --no-audit --no-fund --loglevel=error)
        touch "$modules/.installed"
    fi
fi
"$modules/.bin/componentize-js" "$here/app.js" --wit "$here/wit" --world-name {{world}} \
    -o "$here/{{name}}.wasm"
echo "built $here/{{name}}.wasm"
