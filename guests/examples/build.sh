#!/usr/bin/env bash
# Build the example backends written in Python (componentize-py) and JavaScript
# (componentize-js) into OUT, each with its manifest: OUT/py-serial.{wasm,toml} and
# OUT/js-fusetun.{wasm,toml}. The tools come from PATH (./scripts/test puts them there).
set -euo pipefail
out=${1:?usage: build.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
wit="$here/../../wit/since_v0.1.0"
# componentize-py imports app.py with the host's Python: no __pycache__ in the source tree.
export PYTHONDONTWRITEBYTECODE=1

(cd "$here/python-serial" && componentize-py -d "$wit" -w devplug-backend componentize app -o "$out/py-serial.wasm" >/dev/null)
cp "$here/python-serial/devplug.toml" "$out/py-serial.toml"

cd "$here/js-fusetun"
# `npm ci` trips over npm 11's lock files for platform-specific optional packages; with
# --no-save, `npm install` installs the locked versions and leaves the lock file alone.
[ -x node_modules/.bin/componentize-js ] || npm install --no-save --no-audit --no-fund --silent
node_modules/.bin/componentize-js --wit "$wit" --world-name devplug-backend -d http -d fetch-event -o "$out/js-fusetun.wasm" backend.js
# componentize-js exits 0 on some failures: the file is the proof.
[ -s "$out/js-fusetun.wasm" ] || { echo "componentize-js produced no component" >&2; exit 1; }
cp devplug.toml "$out/js-fusetun.toml"
