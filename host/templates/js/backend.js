// {{name}}: a devplug backend in JavaScript. It serves `{{resource}}`: one device per node under
// /dev matching the glob in its config (`paths = "..."`). For DRA (devplug:backend@0.3.0) it
// describes each device with typed attributes: its node's major and minor numbers.
//
// Build: npm install && npm run build
// Test:  npm test
import { glob, stat } from "devplug:backend/devfs@0.3.0";

const RESOURCE = "{{resource}}";
let pattern = "{{name}}*";

const edits = (nodes = []) => ({
  deviceNodes: nodes.map((n) => ({ containerPath: `/dev/${n}`, hostPath: "", permissions: "rw" })),
  mounts: [],
  env: [],
  annotations: [],
});

export const backend = {
  init(config) {
    const m = /paths\s*=\s*"([^"]+)"/.exec(config);
    if (config.trim() && !m) throw { tag: "invalid-config", val: `expected paths = "GLOB", got ${JSON.stringify(config)}` };
    if (m) pattern = m[1];
    return { name: "{{name}}", version: "0.1.0", resources: [{ name: RESOURCE, preferredAllocation: false, preStartRequired: false }] };
  },
  discover() {
    let nodes = [];
    try { nodes = glob(pattern); } catch (e) { nodes = []; }
    const devices = nodes
      .filter((n) => n.kind === "character")
      .map((n) => ({ id: n.path.replace("/", "_"), health: "healthy", numaNodes: [], attributes: [], edits: edits([n.path]) }));
    return [{ name: RESOURCE, devices, commonEdits: edits() }];
  },
  preferredAllocation() { throw { tag: "unsupported" }; },
  allocate() { return edits(); },
  preStart() {},
};

// What DRA publishes beyond discover's string attributes: typed values (`text`, `integer` as a
// BigInt, `flag`, `version`), capacities, and counter sets partitions of one device share.
export const dra = {
  describe() {
    const devices = [];
    for (const r of backend.discover()) {
      for (const d of r.devices) {
        let n;
        try { n = stat(d.edits.deviceNodes[0].containerPath.slice("/dev/".length)); } catch (e) { continue; }
        const attributes = [["major", { tag: "integer", val: BigInt(n.major) }], ["minor", { tag: "integer", val: BigInt(n.minor) }]];
        devices.push({ resource: r.name, id: d.id, attributes, capacity: [], consumesCounters: [], allowMultipleAllocations: false });
      }
    }
    return { counterSets: [], devices };
  },
  // A claim's edits come from `allocate` (and each device's own from discover).
  prepare() { throw { tag: "unsupported" }; },
  unprepare() {},
};
