"""Scale-out on Ray: a controller with a persisted group ledger, rollout workers with node-local sandbox
pools, inference servers wrapping any :class:`~agentrl.protocols.UpdatablePolicy`, a learner group, and
versioned weight sync with checksums: ``agentrl train --ray local|auto|ray://host:port``
(docs/distributed.md).

Ray is optional (``pip install 'agentrl[ray]'``): importing this package does not import it; starting a
runtime without it raises a :class:`~agentrl.errors.ConfigError` that says how to install it.
"""

from agentrl.trainers.ray.ledger import GroupLedger, GroupState, LedgerEntry, LedgerError
from agentrl.trainers.ray.runtime import RESOURCES, RayOptions, RayRuntime, ray_runtime, require_ray
from agentrl.trainers.ray.weights import (
    ObjectStoreTransport,
    SharedDiskTransport,
    WeightRef,
    WeightTransport,
    make_transport,
)

__all__ = [
    "RESOURCES",
    "GroupLedger",
    "GroupState",
    "LedgerEntry",
    "LedgerError",
    "ObjectStoreTransport",
    "RayOptions",
    "RayRuntime",
    "SharedDiskTransport",
    "WeightRef",
    "WeightTransport",
    "make_transport",
    "ray_runtime",
    "require_ray",
]
