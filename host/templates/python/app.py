"""{{name}}: a devplug backend in Python. It serves `{{resource}}`: one device per node under
/dev matching the globs in its config (`paths = ["..."]`, TOML). For DRA (devplug:backend@0.3.0)
it describes each device with typed attributes: its node's major and minor numbers.

Build: componentize-py -d wit -w devplug-backend componentize app -p src -o {{name}}.wasm
Test:  ./test.sh
"""
import tomllib

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import dra
from wit_world.imports import devfs, types

RESOURCE = "{{resource}}"
paths = ["{{name}}*"]


def node_edits(nodes=()):
    return types.ContainerEdits(
        device_nodes=[types.DeviceNode(container_path=f"/dev/{n}", host_path="", permissions="rw") for n in nodes],
        mounts=[],
        env=[],
        annotations=[],
    )


class Backend(exports.Backend):
    def init(self, config):
        global paths
        if config.strip():
            try:
                paths = tomllib.loads(config).get("paths", paths)
            except tomllib.TOMLDecodeError as e:
                raise Err(types.BackendError_InvalidConfig(str(e)))
        info = types.ResourceInfo(name=RESOURCE, preferred_allocation=False, pre_start_required=False)
        return types.Info(name="{{name}}", version="0.1.0", resources=[info])

    def discover(self):
        devices = []
        for p in paths:
            try:
                nodes = devfs.glob(p)
            except Err:
                nodes = []
            for n in nodes:
                if n.kind == devfs.NodeKind.CHARACTER:
                    devices.append(types.Device(id=n.path.replace("/", "_"), health=types.Health.HEALTHY,
                                                numa_nodes=[], attributes=[], edits=node_edits([n.path])))
        return [types.Resource(name=RESOURCE, devices=devices, common_edits=node_edits())]

    def preferred_allocation(self, resource, available, must_include, size):
        raise Err(types.BackendError_Unsupported())

    def allocate(self, resource, ids):
        return node_edits()

    def pre_start(self, resource, ids):
        return None


class Dra(exports.Dra):
    def describe(self):
        # What DRA publishes beyond discover's string attributes: typed values (text, integer,
        # flag, version), capacities, and counter sets that partitions of one device share.
        devices = []
        for r in Backend().discover():
            for d in r.devices:
                try:
                    n = devfs.stat(d.edits.device_nodes[0].container_path.removeprefix("/dev/"))
                except Err:
                    continue
                attributes = [("major", dra.AttributeValue_Integer(n.major)), ("minor", dra.AttributeValue_Integer(n.minor))]
                devices.append(dra.DeviceDescription(resource=r.name, id=d.id, attributes=attributes, capacity=[],
                                                     consumes_counters=[], allow_multiple_allocations=False))
        return dra.PoolDescription(counter_sets=[], devices=devices)

    def prepare(self, claim_uid, devices, config):
        # A claim's edits come from `allocate` (and each device's own from discover).
        raise Err(types.BackendError_Unsupported())

    def unprepare(self, claim_uid):
        return None
