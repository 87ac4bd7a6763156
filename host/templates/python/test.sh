#!/usr/bin/env sh
# Build, then check that devplug finds the fixture's two nodes.
set -eu
cd "$(dirname "$0")"
componentize-py -d wit -w devplug-backend componentize app -p src -o {{name}}.wasm >/dev/null
out=$(devplug discover --backend {{name}}.wasm --manifest devplug.toml --sysfs-root tests/fixture/sys --dev-root tests/fixture/dev --dev-fixtures --format json)
for id in {{name}}0 {{name}}1; do
  echo "$out" | grep -q "\"id\": \"$id\"" || { echo "FAIL: $id not discovered"; echo "$out"; exit 1; }
done
echo "ok: {{name}} finds {{name}}0 and {{name}}1"
