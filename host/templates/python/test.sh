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
# DRA: the slices this node would publish carry the typed attributes describe gives.
slices=$(devplug dra slices --backend {{name}}.wasm --manifest devplug.toml --sysfs-root tests/fixture/sys --dev-root tests/fixture/dev --dev-fixtures --node-name test)
echo "$slices" | python3 -c 'import json,sys; d=[x for s in json.load(sys.stdin)["items"] for x in s.get("spec",{}).get("devices",[])]; assert sorted(x["attributes"]["major"]["int"] for x in d)==[240,240], d' \
  || { echo "FAIL: no typed major in the slices"; echo "$slices"; exit 1; }
echo "ok: {{name}}'s slices carry typed attributes"
