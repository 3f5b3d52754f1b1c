#!/usr/bin/env bash
# Builds every guest component into out/:
#   out/*.wasm       the examples (a services directory you can serve as is)
#   out/test/*.wasm  test guests and deliberately bad files for the host's tests
#
# Needs: cargo with the wasm32-wasip2 target (`rustup target add wasm32-wasip2`), python3
# (>= 3.10, with venv and pip) and node (>= 18) with npm. The Python and JavaScript toolchains
# are pinned (requirements.txt, package-lock.json), shared by the examples in each language,
# and installed here on first use: componentize-py into .venv/, componentize-js into
# node_modules/.
# A component is rebuilt only when a source, the WIT or the pinned toolchain is newer.
# To add a guest in another language, add a build_<lang> function below and call it at the
# end; each one writes its components into "$out" or "$out/test".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/out"
# Our own target dir: the host's (possibly shared) CARGO_TARGET_DIR is for another target.
target="${GUEST_TARGET_DIR:-$here/target}"
mkdir -p "$out/test"
# Test binaries run this concurrently (e.g. under nextest): one build at a time.
if command -v flock >/dev/null; then
    exec 9>"$out/.build.lock"
    flock 9
fi

build_rust() {
    local wasm="$target/wasm32-wasip2/release"
    CARGO_TARGET_DIR="$target" cargo build --quiet --release --locked \
        --manifest-path "$here/Cargo.toml" --target wasm32-wasip2 --workspace
    # example services: file stem = service name
    cp "$wasm/rust_ticker.wasm" "$out/rust-ticker.wasm"
    cp "$wasm/rust_counter.wasm" "$out/rust-counter.wasm"
    cp "$wasm/rust-command.wasm" "$out/rust-command.wasm"
    cp "$wasm/rust_http.wasm" "$out/rust-http.wasm"
    # test guests
    local t
    for t in trap spin hog nosy effects journal kv_flood kv_bench other_world leak http_client http_hello http_both foreign_import wasi_hello spin_sdk_app cron_sdk_app p3_http p3_command spin7_app; do
        cp "$wasm/test_$t.wasm" "$out/test/${t//_/-}.wasm"
    done
    # A binary, as wstd's README makes an HTTP server.
    cp "$wasm/test-wstd-hello.wasm" "$out/test/wstd-hello.wasm"
    # A plain command (fn main) for scheduled services.
    cp "$wasm/test-fire-command.wasm" "$out/test/fire-command.wasm"
}

wit="$here/../wit"

# True if $1 is missing or older than any file under the other arguments.
stale() {
    local target=$1
    shift
    [[ ! -e "$target" ]] || [[ -n "$(find "$@" -newer "$target" -print -quit)" ]]
}

# The pinned componentize-py, (re)installed into .venv/ when requirements.txt is newer.
install_python() {
    local venv="$here/.venv"
    if stale "$venv/.installed" "$here/requirements.txt"; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
        touch "$venv/.installed"
    fi
}

# build_python NAME WORLD [test]: NAME/app.py into out/NAME.wasm for WORLD, when a source is
# newer; with `test`, test-guests/NAME/app.py into out/test/NAME.wasm. WORLD is in ../wit or
# its deps (e.g. `wasi:cli/command`). Bindings are generated into the build, not kept in the tree.
build_python() {
    local name=$1 world=$2 installed="$here/.venv/.installed" src="$here/$1" dest="$out/$1.wasm"
    if [[ "${3:-}" == test ]]; then
        src="$here/test-guests/$name"
        dest="$out/test/$name.wasm"
    fi
    if stale "$dest" "$src"/*.py "$wit" "$installed"; then
        "$here/.venv/bin/componentize-py" --quiet -d "$wit" -w "$world" componentize \
            -p "$src" app -o "$dest.tmp"
        mv "$dest.tmp" "$dest"
    fi
}

# A Spin Python SDK's test guest, NAME, with that SDK's own pinned componentize-py, in its own
# VENV, (re)installed when its requirements.txt is newer; built for WORLD, which componentize-py
# finds in the venv's spin_sdk package (VIRTUAL_ENV).
#   spin-python-app: spin-sdk 3.4.1 (WASI 0.2), world spin-http
#   spin5-python-app: spin-sdk 5.0.0 (WASI 0.3), world spin:up/http-trigger@4.1.0
build_spin_python() {
    local name=$1 venv="$here/$2" world=$3 src="$here/test-guests/$1"
    if stale "$venv/.installed" "$src/requirements.txt"; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$src/requirements.txt"
        touch "$venv/.installed"
    fi
    if stale "$out/test/$name.wasm" "$src"/*.py "$venv/.installed"; then
        VIRTUAL_ENV="$venv" "$venv/bin/componentize-py" --quiet -w "$world" componentize \
            -p "$src" app -o "$out/test/$name.wasm.tmp"
        mv "$out/test/$name.wasm.tmp" "$out/test/$name.wasm"
    fi
}

# The locked componentize-js, installed into node_modules/ when the lock is newer. Not
# `npm ci`: the lock lacks some other platforms' optional binaries, which `npm ci` rejects.
install_js() {
    if stale "$here/node_modules/.installed" "$here/package-lock.json"; then
        (cd "$here" && npm install --no-audit --no-fund --loglevel=error)
        touch "$here/node_modules/.installed"
    fi
}

# build_js NAME SOURCE WORLD: NAME/SOURCE into out/NAME.wasm for WORLD, when a file in NAME/ is
# newer. If NAME/wit/ exists, the WIT is a copy of ../wit with it copied over (js-http's world).
build_js() {
    local name=$1 world=$3 wit_dir="$wit" installed="$here/node_modules/.installed"
    if stale "$out/$name.wasm" "$here/$name" "$wit" "$installed"; then
        if [[ -d "$here/$name/wit" ]]; then
            wit_dir="$target/wit-$name"
            rm -rf "$wit_dir"
            mkdir -p "$wit_dir"
            cp -R "$wit/." "$here/$name/wit/." "$wit_dir"
        fi
        "$here/node_modules/.bin/componentize-js" "$here/$name/$2" --wit "$wit_dir" \
            --world-name "$world" -o "$out/$name.wasm.tmp"
        mv "$out/$name.wasm.tmp" "$out/$name.wasm"
    fi
}

bad_files() {
    # Not components: an empty file, a component cut in half, a core module.
    : >"$out/test/empty.wasm"
    local size
    size=$(wc -c <"$out/rust-ticker.wasm")
    head -c $((size / 2)) "$out/rust-ticker.wasm" >"$out/test/truncated.wasm"
    printf '\000asm\001\000\000\000' >"$out/test/core-module.wasm"
}

build_rust
install_python
build_python python-ticker service
build_python python-http http-service
build_python fire-python wasi:cli/command test
build_python python-hello wasi:http/proxy@0.2.12 test
build_spin_python spin-python-app .venv-spin spin-http
build_spin_python spin5-python-app .venv-spin5 spin:up/http-trigger@4.1.0
install_js
build_js js-ticker ticker.js service
build_js js-http http.js http-service-js
bad_files
