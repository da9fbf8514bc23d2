"""The Ray actors of a distributed run: inference servers, the load balancer, rollout workers.

The classes here are plain Python; :mod:`agentrl.trainers.ray.runtime` turns them into actors with
``ray.remote`` (and the placement options of each role), so this module imports Ray only where a running
actor needs it.

* :class:`InferenceServer` wraps any :class:`~agentrl.protocols.UpdatablePolicy` (the HF engine, vLLM, a
  scripted one) behind the token-in/token-out :class:`~agentrl.protocols.Generation` contract (sampled ids,
  the sampler's log-probs, the weights version). Before it serves its first request, and whenever the
  controller asks, it pulls the newest weights from the broker, so a restarted server never samples with
  stale weights.
* :class:`LoadBalancer` gives each *episode* the server with the fewest episodes in flight; all turns of the
  episode go to that server (sticky), which keeps a server's prefix cache useful.
* :class:`RolloutWorker` runs whole groups (many episodes at once) with a sandbox pool on its own node, and
  stamps every trajectory with who produced it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError, PolicyError
from agentrl.models import resolve_tokenizer, use_tokenizer
from agentrl.protocols import Generation, Sampling, UpdatablePolicy, WeightSink, WeightUpdate
from agentrl.rollout import schedule_groups
from agentrl.samples import run_samples
from agentrl.trainers.ray.weights import WeightRef, WeightTransport
from agentrl.types import Provenance, StopReason, Trajectory, TrajectoryMeta
from agentrl.weights import weights_checksum

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.trainers.train_config import TrainConfig

__all__ = [
    "BalancedServerPolicy",
    "GroupLease",
    "GroupResult",
    "InferenceServer",
    "LoadBalancer",
    "PolicyFactory",
    "RolloutWorker",
    "ServerPolicy",
    "ServerState",
    "handed_tokenizer",
    "hf_policy_factory",
]

PolicyFactory = Callable[["TrainConfig", int], UpdatablePolicy]
"""``factory(train_config, version) -> UpdatablePolicy``: builds the sampler inside a server process."""


def hf_policy_factory(cfg: TrainConfig, version: int) -> UpdatablePolicy:
    """The sampler ``agentrl train`` would use in one process (HF on CPU/GPU, or vLLM with
    ``--policy vllm``), built from the run's model spec."""
    from agentrl.models import resolve_model
    from agentrl.trainers import factories

    loaded = resolve_model(
        factories.sampler_spec(cfg)
    )  # the sampler's dtype (bf16 on CUDA), not the master's
    if cfg.weights.lora.enabled:  # the same seeded adapters as the learner's; syncs then replace only them
        from agentrl.lora import apply_lora

        apply_lora(loaded.model, cfg.weights.lora, name=cfg.model, seed=cfg.seed)
    renderer = ChatRenderer(loaded.tokenizer)
    return factories.make_policy(
        cfg, loaded.model, loaded.tokenizer, renderer, loaded.device, version=version
    )


def handed_tokenizer(ray: Any, model: str) -> Any:
    """The tokenizer of ``model`` for the actors to share: resolved once in this (the driver's) process and
    put in the object store. An actor unpickles it in a fraction of a second, where loading it through
    AutoTokenizer imports transformers' model machinery and torch (seconds of CPU per actor). Ray keeps the
    object while the driver holds the reference, so actors Ray restarts and replacement workers get it too.

    Returns:
        The object reference, or None where the model's folder is not on this machine (a driver outside
        the cluster): each actor then loads its own, as before.
    """
    try:
        tok = resolve_tokenizer(model)
    except ConfigError:
        return None
    return ray.put(tok)


def _node() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())[:12]
    except Exception:  # outside Ray (unit use): the host is the node
        return socket.gethostname()


@dataclass(frozen=True)
class ServerState:
    """What a server reports after a sync."""

    name: str
    """The server's name (``server-<k>``)."""
    version: int
    """Version of the weights it samples with."""
    checksum: str
    """:func:`agentrl.weights_checksum` of the weights it holds (its model's own tensors when the policy
    exposes its model, else the tensors it loaded)."""
    node: str
    """Ray node id it runs on."""
    starts: int
    """How many times this server has been started by this process's Ray (1 = never restarted)."""


class InferenceServer:
    """One inference server: an :class:`~agentrl.protocols.UpdatablePolicy` behind Ray calls."""

    def __init__(
        self,
        name: str,
        factory: PolicyFactory,
        cfg: TrainConfig,
        broker: Any,
        transport: WeightTransport,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ):
        if tokenizer is not None:  # the driver's: a factory's resolve_tokenizer(cfg.model) loads nothing
            use_tokenizer(cfg.model, tokenizer)
        policy = factory(cfg, 0)
        if not isinstance(policy, WeightSink):
            raise ConfigError(
                f"{type(policy).__name__} cannot take weights (it is not a WeightSink): an external "
                "OpenAI-compatible endpoint can evaluate but not train; serve the model with agentrl's HF or "
                "vLLM policy for training"
            )
        self.name, self.policy, self.broker, self.transport = name, policy, broker, transport
        self.checksum = ""
        self.node = _node()
        self._lock = asyncio.Lock()
        self._synced = False
        self.starts = 0

    async def sync(self) -> ServerState:
        """Pull the newest weights from the broker and load them (a no-op when already current)."""
        async with self._lock:
            if not self.starts:
                self.starts = await self.broker.started.remote(self.name)
            ref: WeightRef | None = await self.broker.latest.remote()
            if ref is not None and (
                not self._synced or ref.version > self.policy.version or not self.checksum
            ):
                tensors = await asyncio.to_thread(self.transport.get, ref)
                await self.policy.load_weights(WeightUpdate(ref.version, tensors))
                self.checksum = await asyncio.to_thread(self._held_checksum, tensors)
            self._synced = True
            return self.state()

    def _held_checksum(self, loaded: dict[str, Any]) -> str:
        model = getattr(self.policy, "model", None)
        if model is not None and hasattr(model, "state_dict"):
            own = model.state_dict()
            return weights_checksum({k: own[k] for k in loaded if k in own})
        return weights_checksum(loaded)

    def state(self) -> ServerState:
        """The server's version and checksum now."""
        return ServerState(self.name, self.policy.version, self.checksum, self.node, self.starts)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample one turn (token ids in, :class:`Generation` out)."""
        if not self._synced:
            await self.sync()
        return await self.policy.generate(prompt_ids, sampling)


class LoadBalancer:
    """Picks the server with the fewest episodes in flight; the episode keeps it (sticky)."""

    def __init__(self, n_servers: int):
        if n_servers < 1:
            raise ConfigError("the load balancer needs at least one inference server")
        self.in_flight = [0] * n_servers

    def acquire(self, exclude: int | None = None) -> int:
        """A server index for a new episode (not ``exclude`` unless it is the only server)."""
        choices = [i for i in range(len(self.in_flight)) if i != exclude] or [0]
        i = min(choices, key=self.in_flight.__getitem__)
        self.in_flight[i] += 1
        return i

    def release(self, index: int) -> None:
        """The episode on server ``index`` ended."""
        self.in_flight[index] = max(self.in_flight[index] - 1, 0)

    def loads(self) -> list[int]:
        """Episodes in flight per server."""
        return list(self.in_flight)


class ServerPolicy:
    """The :class:`~agentrl.protocols.Policy` one episode sees: every turn goes to one server (sticky). When
    that server dies or is restarting, the turn fails over to the least-loaded other server (the same one
    after a pause when it is the only one), a few times at most."""

    def __init__(self, servers: Sequence[Any], balancer: Any, index: int, failovers: int = 3):
        self.servers, self.balancer, self.index = servers, balancer, index
        self.max_failovers = failovers
        self.failovers = 0
        self._version = 0
        self.lost = False
        """No server answered after the failovers (the episode is retried or becomes an infra failure)."""

    @property
    def name(self) -> str:
        """The server the episode is on now (``server-<k>``)."""
        return f"server-{self.index}"

    @property
    def version(self) -> int:
        """The weights version of the last turn sampled."""
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """One turn on the episode's server (failing over when it died)."""
        from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError

        gone = (RayActorError, OutOfMemoryError, WorkerCrashedError)  # dead, restarting, killed for memory

        while True:
            try:
                gen: Generation = await self.servers[self.index].generate.remote(tuple(prompt_ids), sampling)
                break
            except gone as e:
                if self.failovers >= self.max_failovers:
                    self.lost = True
                    raise PolicyError(f"inference server {self.name} died during a request: {e}") from e
                self.failovers += 1
                await asyncio.sleep(0.5 * self.failovers)  # a restarting server needs a moment
                old = self.index
                self.index = await self.balancer.acquire.remote(exclude=old)
                self.balancer.release.remote(old)
        self._version = gen.policy_version
        return gen


class BalancedServerPolicy:
    """The :class:`~agentrl.protocols.Policy` of a rollout worker's gateway (``--agent`` on Ray): the gateway
    shares one policy among its sessions, so each turn goes to the server with the fewest episodes in flight
    (a session's turns may land on different servers, all holding the same weights version between syncs).
    A server that died is skipped for another, a few times at most."""

    def __init__(self, servers: Sequence[Any], balancer: Any, failovers: int = 3):
        self.servers, self.balancer, self.max_failovers = servers, balancer, failovers
        self._version = 0

    @property
    def version(self) -> int:
        """The weights version of the last turn sampled."""
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """One turn on the least-loaded server."""
        from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError

        gone = (RayActorError, OutOfMemoryError, WorkerCrashedError)  # dead, restarting, killed for memory

        for attempt in range(self.max_failovers + 1):
            index: int = await self.balancer.acquire.remote()
            try:
                gen: Generation = await self.servers[index].generate.remote(tuple(prompt_ids), sampling)
            except gone as e:
                if attempt == self.max_failovers:
                    raise PolicyError(f"no inference server answered (server-{index} died: {e})") from e
                await asyncio.sleep(0.5 * (attempt + 1))  # a restarting server needs a moment
                continue
            finally:
                self.balancer.release.remote(index)
            self._version = gen.policy_version
            return gen
        raise AssertionError("unreachable: the loop returns or raises")


@dataclass(frozen=True)
class GroupLease:
    """One group as the controller hands it to a worker."""

    step: int
    """Training step."""
    seed: int
    """Task seed."""
    group_id: str
    """The id of this attempt (see :mod:`agentrl.trainers.ray.ledger`)."""
    group_size: int
    """Episodes to run."""
    meta: TrajectoryMeta
    """Base identity for every member (env id, step, policy version)."""


@dataclass(frozen=True)
class GroupResult:
    """A worker's finished group."""

    lease: GroupLease
    """What was asked."""
    trajectories: tuple[Trajectory, ...]
    """The members, in the order they finished."""
    worker: str
    """The worker that ran it."""


class RolloutWorker:
    """Runs groups of episodes with a node-local sandbox pool; many groups at once."""

    def __init__(
        self,
        name: str,
        cfg: TrainConfig,
        servers: Sequence[Any],
        balancer: Any,
        setup: Callable[[], None] | None = None,
        episode_retries: int = 2,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ):
        # The driver's tokenizer, unpickled: AutoTokenizer would import transformers' model machinery and
        # torch (seconds of CPU per worker) to load the same object. The renderer and the env factory get
        # it through resolve_tokenizer(cfg.model).
        if tokenizer is not None:
            use_tokenizer(cfg.model, tokenizer)
        if setup is not None:
            setup()
        self.name, self.cfg, self.servers, self.balancer = name, cfg, list(servers), balancer
        self.episode_retries = episode_retries
        self.renderer = ChatRenderer(resolve_tokenizer(cfg.model))
        self.node = _node()
        self.pool_id = f"{name}@{self.node}/pid{os.getpid()}"
        self._pool: Any = None
        self._make_env: Callable[[], Any] | None = None
        self._agent: Any = None
        """``--agent``: the worker's :class:`~agentrl.trainers.gateway.agent_rollout.AgentRunner`, its gateway
        in front of the inference servers (started on the first group)."""
        self._limit = asyncio.Semaphore(cfg.rollout.concurrency)
        self._setup_lock = asyncio.Lock()
        from agentrl.trainers.runtime import group_hook

        self._finish_group = group_hook(cfg)  # --reward.relative-judge: each group judged here, as locally

    async def _env_factory(self) -> Callable[[], Any]:
        # One pool per worker: the first groups arrive together, and without the lock each built a pool of
        # its own while the others' starts were awaited, leaving all but the last one's sandboxes running.
        async with self._setup_lock:
            if self._make_env is None:
                from agentrl.trainers import factories

                # As in the local runtime: none for envs that run no code. Its --sandbox.max-starting is the
                # driver's (RayRuntime hands the workers a config with it resolved: with_sandbox_cap).
                pool = factories.sandbox_pool(self.cfg, self.cfg.rollout.concurrency)
                if pool is not None:
                    try:
                        self._pool = await pool.__aenter__()
                    except BaseException:
                        await pool.close()  # the sandboxes that did start (the group fails, and is retried)
                        raise
                self._make_env = factories.env_factory(self.cfg, self._pool)
            return self._make_env

    async def _agent_runner(self) -> Any:
        if self._agent is None:
            from agentrl.trainers.gateway import Gateway
            from agentrl.trainers.gateway.agent_rollout import (
                AgentRunner,
                gateway_config,
                load_agent,
                task_source,
            )

            cfg = self.cfg
            assert cfg.agent is not None
            tasks = task_source(cfg.env, cfg.env_kwargs)
            policy = BalancedServerPolicy(self.servers, self.balancer)
            gateway = Gateway(policy, self.renderer, gateway_config(cfg, tasks), auto_sessions=False)
            await gateway.__aenter__()
            self._agent = AgentRunner(
                load_agent(cfg.agent), tasks, gateway, concurrency=cfg.rollout.concurrency
            )
        return self._agent

    async def close(self) -> None:
        """Close the sandbox pool and the gateway, and remove the pool's cgroups (the controller kills this
        actor next, which skips the cleanup at exit)."""
        if self._pool is not None:
            from agentrl.sandbox import release_cgroups

            await self._pool.close()
            release_cgroups()
        if self._agent is not None:
            await self._agent.gateway.__aexit__(None, None, None)

    def where(self) -> str:
        """The node this worker runs on."""
        return self.node

    async def run_group(self, lease: GroupLease) -> GroupResult:
        """Run every member of ``lease`` (the one scheduler, :func:`agentrl.rollout.schedule_groups`, under
        this worker's episode limit) and return the group."""
        env_id = lease.meta.env_id or str(self.cfg.env)
        if self.cfg.agent is not None:  # a gateway session per episode, the agent run in this worker
            runner = await self._agent_runner()
            sessions = runner.episodes(lease.group_size)
            env_id = runner.tasks.name
            # the gateway balances turns over the servers, and the agent runs its tools in this worker
            where = Provenance(worker=self.name, server="balanced", node=self.node, sandbox_pool=self.pool_id)

            async def episode(seed: int, member: int, meta: TrajectoryMeta) -> tuple[Trajectory, ...]:
                trajs = await sessions(seed, member, meta)
                return tuple(_stamped(t, where) for t in trajs)

        else:
            make_env = await self._env_factory()

            async def episode(seed: int, member: int, meta: TrajectoryMeta) -> tuple[Trajectory, ...]:
                return await self._episode(make_env, lease.step, seed, member, meta)

        events = schedule_groups(
            episode,
            env_id=env_id,
            seeds=(lease.seed,),
            group_size=lease.group_size,
            meta=dataclasses.replace(lease.meta, group_id=lease.group_id),
            concurrency=self.cfg.rollout.concurrency,
            limit=self._limit,
            finish_group=self._finish_group,
        )
        finished = tuple([done.trajectory async for done in events])
        return GroupResult(lease, finished, self.name)

    async def _episode(
        self, make_env: Callable[[], Any], step: int, seed: int, member: int, group: TrajectoryMeta
    ) -> tuple[Trajectory, ...]:
        """One episode on the inference servers (its samples: several when the env compacts its context or
        a tool runs a sub-agent, :func:`agentrl.samples.run_samples`): sticky to the server the balancer
        gives it, started over on another (a few times at most) when its server was lost."""
        meta = dataclasses.replace(group, episode_id=f"{group.group_id}-m{member}")
        from agentrl.trainers.factories import rollout_config

        rollout = rollout_config(self.cfg, step)  # the step's seed, as single-process
        for attempt in range(self.episode_retries + 1):
            index: int = await self.balancer.acquire.remote()
            policy = ServerPolicy(self.servers, self.balancer, index)
            env = make_env()
            try:
                samples = await run_samples(
                    env, policy, self.renderer, rollout, seed=seed, meta=meta, member=member
                )
            finally:
                await env.close()
                self.balancer.release.remote(policy.index)
            if (
                not (policy.lost and samples[-1].stop_reason is StopReason.POLICY_ERROR)
                or attempt == self.episode_retries
            ):
                break  # a lost server's episode starts over on another server, a few times at most
        provenance = Provenance(
            worker=self.name,
            server=policy.name,
            node=self.node,
            sandbox_pool=self.pool_id,
            episode_attempts=attempt + 1,
            server_failovers=policy.failovers,
        )
        return tuple(_stamped(t, provenance) for t in samples)


def _stamped(traj: Trajectory, provenance: Provenance) -> Trajectory:
    """``traj`` with who produced it (worker, server, node, sandbox pool) in its meta."""
    return dataclasses.replace(traj, meta=dataclasses.replace(traj.meta, provenance=provenance))
