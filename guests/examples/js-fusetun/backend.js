// A devplug backend in JavaScript: FUSE and TUN for containers that build or tunnel,
// /dev/fuse and /dev/net/tun shared `count` ways each.
import { glob } from "devplug:backend/devfs@0.1.0";

let count = 4;

const edits = (nodes = [], env = []) => ({ deviceNodes: nodes.map((n) => ({ containerPath: `/dev/${n}`, hostPath: "", permissions: "rw" })), mounts: [], env, annotations: [] });

export const backend = {
  init(config) {
    const m = /count\s*=\s*(\d+)/.exec(config);
    if (config.trim() && !m) throw { tag: "invalid-config", val: `expected "count = N", got ${JSON.stringify(config)}` };
    if (m) count = Number(m[1]);
    return { name: "js-fusetun", version: "0.1.0", resources: ["devplug.io/js-fuse", "devplug.io/js-tun"].map((name) => ({ name, preferredAllocation: false, preStartRequired: false })) };
  },
  discover() {
    const one = (name, pattern) => {
      let nodes = [];
      try { nodes = glob(pattern); } catch (e) { nodes = []; }
      const devices = [];
      for (const n of nodes.filter((n) => n.kind === "character")) {
        for (let i = 0; i < count; i++) {
          devices.push({ id: `${n.path.replace("/", "_")}-${i}`, health: "healthy", numaNodes: [], attributes: [["path", `/dev/${n.path}`]], edits: edits([n.path]) });
        }
      }
      return { name, devices, commonEdits: edits() };
    };
    return [one("devplug.io/js-fuse", "fuse"), one("devplug.io/js-tun", "net/tun")];
  },
  preferredAllocation() { throw { tag: "unsupported" }; },
  allocate(resource, ids) { return edits([], [["JS_DEVICES", ids.join(",")]]); },
  preStart() {},
};
