// {{name}}: a devplug backend in JavaScript. It serves `{{resource}}`: one device per node under
// /dev matching the glob in its config (`paths = "..."`).
//
// Build: npm install && npm run build
// Test:  npm test
import { glob } from "devplug:backend/devfs@0.2.0";

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
