"""A devplug backend in Python: USB serial adapters (/dev/ttyUSB*, /dev/ttyACM*), one device each."""
import tomllib

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import devfs, types

RESOURCE = "devplug.io/serial"
patterns = ["ttyUSB*", "ttyACM*"]


def edits(nodes=(), env=()):
    return types.ContainerEdits(
        device_nodes=[types.DeviceNode(container_path=f"/dev/{n}", host_path="", permissions="rw") for n in nodes],
        mounts=[],
        env=list(env),
        annotations=[],
    )


class Backend(exports.Backend):
    def init(self, config: str) -> types.Info:
        global patterns
        if config.strip():
            try:
                cfg = tomllib.loads(config)
            except tomllib.TOMLDecodeError as e:
                raise Err(types.BackendError_InvalidConfig(str(e)))
            patterns = cfg.get("paths", patterns)
        info = types.ResourceInfo(name=RESOURCE, preferred_allocation=False, pre_start_required=False)
        return types.Info(name="py-serial", version="0.1.0", resources=[info])

    def discover(self):
        devices = []
        for p in patterns:
            try:
                nodes = devfs.glob(p)
            except Err:
                nodes = []
            for n in nodes:
                if n.kind != devfs.NodeKind.CHARACTER:
                    continue
                devices.append(types.Device(
                    id=n.path,
                    health=types.Health.HEALTHY,
                    numa_nodes=[],
                    attributes=[("major", str(n.major)), ("minor", str(n.minor))],
                    edits=edits([n.path]),
                ))
        return [types.Resource(name=RESOURCE, devices=devices, common_edits=edits())]

    def preferred_allocation(self, resource, available, must_include, size):
        raise Err(types.BackendError_Unsupported())

    def allocate(self, resource, ids):
        if resource != RESOURCE:
            raise Err(types.BackendError_UnknownResource(resource))
        return edits(env=[("SERIAL_PORTS", ",".join(f"/dev/{i}" for i in ids))])

    def pre_start(self, resource, ids):
        return None
