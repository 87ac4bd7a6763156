// Check that devplug finds the fixture's two nodes in the built component.
import { execFileSync } from "node:child_process";

const out = execFileSync("devplug", ["discover", "--backend", "{{name}}.wasm", "--manifest", "devplug.toml", "--sysfs-root", "tests/fixture/sys",
  "--dev-root", "tests/fixture/dev", "--dev-fixtures", "--format", "json"], { encoding: "utf8" });
const ids = JSON.parse(out).resources.flatMap((r) => r.devices.map((d) => d.id)).sort();
if (JSON.stringify(ids) !== JSON.stringify(["{{name}}0", "{{name}}1"])) {
  console.error(`FAIL: discovered ${JSON.stringify(ids)}`);
  process.exit(1);
}
console.log("ok: {{name}} finds {{name}}0 and {{name}}1");

// DRA: the slices this node would publish carry the typed attributes describe gives.
const slices = JSON.parse(execFileSync("devplug", ["dra", "slices", "--backend", "{{name}}.wasm", "--manifest", "devplug.toml",
  "--sysfs-root", "tests/fixture/sys", "--dev-root", "tests/fixture/dev", "--dev-fixtures", "--node-name", "test"], { encoding: "utf8" }));
const majors = slices.items.flatMap((s) => (s.spec?.devices ?? []).map((d) => d.attributes.major?.int));
if (JSON.stringify(majors) !== JSON.stringify([240, 240])) {
  console.error(`FAIL: typed majors ${JSON.stringify(majors)}`);
  process.exit(1);
}
console.log("ok: {{name}}'s slices carry typed attributes");
