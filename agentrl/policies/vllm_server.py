"""VLLMServerPolicy: a ``vllm serve`` process as agentrl's sampler, token in and token out, with weight
updates (an :class:`~agentrl.protocols.UpdatablePolicy`).

Generation goes through the OpenAI-compatible ``/v1/completions`` route (:class:`OpenAIPolicy` builds and
checks the request: the prompt as token ids, ``return_token_ids``, ``logprobs=1``, the turn-end ids as
``stop_token_ids``, ``skip_special_tokens=false``). New weights go through vLLM's development routes
(``VLLM_SERVER_DEV_MODE=1``): ``/pause`` → ``/collective_rpc`` (agentrl's worker extension loads a safetensors
file, :mod:`agentrl.policies.vllm_weights`) → ``/reset_prefix_cache`` → ``/update_weight_version`` →
``/resume``. The server must therefore be started with agentrl's settings; :func:`server_command` builds that
command, and ``python -m agentrl.policies.vllm_server`` runs it::

    python -m agentrl.policies.vllm_server --python /opt/vllm-venv/bin/python --port 8000

:meth:`VLLMServerPolicy.connect` checks the settings that decide faithfulness before the first request:
``logprobs_mode`` must be ``processed_logprobs`` (log-probs of the tempered distribution actually sampled,
what the learner recomputes), and the model's ``generation_config.json`` must not supply hidden sampling
defaults (``--generation-config vllm``).

LoRA (``lora=``; the server started with ``server_command(..., lora_rank=R, max_loras=N)``, which adds
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): each policy version's adapter is loaded
through ``/v1/load_lora_adapter`` under its own name and sampled by naming it as the request's ``model``;
the oldest is unloaded (``/v1/unload_lora_adapter``, and dropped from the workers' LoRA cache) once more
than N are live and its turns have finished (:mod:`agentrl.policies.vllm_lora`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, PolicyError
from agentrl.policies.openai import OpenAIPolicy
from agentrl.policies.vllm_lora import REMOVE_METHOD
from agentrl.policies.vllm_weights import (
    UpdateGate,
    WeightPush,
    default_weights_dir,
    push_weights,
    served_checksum,
)
from agentrl.protocols import Generation, Sampling, WeightUpdate

if TYPE_CHECKING:
    from agentrl.lora import LoraConfig
    from agentrl.policies.vllm_lora import LiveAdapters, ServedAdapter

__all__ = ["HTTPEngineControl", "VLLMServerPolicy", "server_command"]

_WORKER_MODULE = "agentrl_vllm_worker"
_LORA_ENV = "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (server_command(lora_rank=R))"


def server_command(
    model: str | os.PathLike[str],
    *,
    python: str = sys.executable,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str = "agentrl",
    dtype: str = "float32",
    max_model_len: int = 2048,
    seed: int = 0,
    extension_dir: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    lora_rank: int = 0,
    max_loras: int = 1,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``vllm serve`` the way :class:`VLLMServerPolicy` needs it.

    ``python`` is the interpreter of the venv that has vLLM (it need not have agentrl). The worker extension
    (:mod:`agentrl.policies.vllm_worker`) is linked into ``extension_dir`` (a new temporary folder unless
    given) as ``agentrl_vllm_worker`` and that folder alone goes on ``PYTHONPATH``: putting
    ``agentrl/policies`` itself there would shadow the ``vllm`` and ``openai`` packages with agentrl's
    modules of the same name. ``dtype`` should be the learner's, or the weight checksums cannot agree.
    ``lora_rank`` > 0 serves LoRA adapters of that rank, ``max_loras`` at once (``--max-staleness`` + 1),
    loaded at run time through ``/v1/load_lora_adapter``.
    """
    if not Path(model).is_dir():
        raise ConfigError(f"vllm serve needs a local model folder, got {str(model)!r}")
    ext = Path(extension_dir) if extension_dir is not None else Path(tempfile.mkdtemp(prefix="agentrl-vllm-"))
    ext.mkdir(parents=True, exist_ok=True)
    link = ext / f"{_WORKER_MODULE}.py"
    source = Path(__file__).with_name("vllm_worker.py").resolve()
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(source)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ext),
        VLLM_SERVER_DEV_MODE="1",  # the /collective_rpc, /pause and weight-version routes
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    # vLLM's CPU build pins its OpenMP threads to cores by default; on a shared machine that fights others.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU build's default reserves far more
    # `vllm serve` itself looks up the `vllm` distribution, which the CPU repackaging names `vllm-cpu`; the
    # API server module is the same server without that lookup.
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--worker-extension-cls",
        f"{_WORKER_MODULE}.AgentRLWorkerExtension",
    ]
    if lora_rank > 0:
        from agentrl.policies.vllm_lora import engine_lora_kwargs

        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # the load/unload adapter routes
        for k, v in engine_lora_kwargs(lora_rank, max_loras).items():
            argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return [*argv, *extra_args], env


class HTTPEngineControl:
    """:class:`~agentrl.policies.vllm_weights.EngineControl` over a ``vllm serve`` process's HTTP routes.

    Args:
        root: The server's root URL (``http://127.0.0.1:8000``, without ``/v1``).
        timeout: Seconds per call; a weight load of a large model needs more than a generation does.
    """

    def __init__(self, root: str, *, timeout: float = 600.0, client: Any = None):
        import httpx

        self.root = root.rstrip("/")
        self.client: Any = client if client is not None else httpx.AsyncClient(timeout=timeout)

    async def _call(
        self, method: str, path: str, *, env: str = "VLLM_SERVER_DEV_MODE=1", **kwargs: Any
    ) -> Any:
        import httpx

        try:
            r = await self.client.request(method, self.root + path, **kwargs)
        except httpx.HTTPError as e:
            raise PolicyError(f"vLLM server {self.root}: {method} {path} failed: {e!r}") from e
        if r.status_code == 404 and "adapter" not in r.text:
            raise PolicyError(
                f"vLLM server {self.root} has no {path} route: start it with {env} "
                "(agentrl.policies.vllm_server.server_command does)"
            )
        if r.status_code >= 400:
            raise PolicyError(f"vLLM server {self.root}: {method} {path} -> {r.status_code}: {r.text[:500]}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:  # the adapter routes answer in plain text
            return r.text

    async def add_adapter(self, name: str, lora_id: int, path: str) -> None:
        """``POST /v1/load_lora_adapter``: the server loads the folder into its workers under ``name`` (it
        picks the id itself)."""
        body = {"lora_name": name, "lora_path": path}
        await self._call("POST", "/v1/load_lora_adapter", json=body, env=_LORA_ENV)

    async def remove_adapter(self, name: str, lora_id: int) -> None:
        """``POST /v1/unload_lora_adapter``, then drop the tensors from every worker's LoRA cache (the route
        only forgets the name)."""
        await self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": name}, env=_LORA_ENV)
        await self.collective_rpc(REMOVE_METHOD, str(lora_id))

    async def collective_rpc(self, method: str, *args: str) -> list[Any]:
        """``POST /collective_rpc``; the extension's methods take and return strings."""
        body = await self._call("POST", "/collective_rpc", json={"method": method, "args": list(args)})
        results = body.get("results") if isinstance(body, Mapping) else None
        if not isinstance(results, list):
            raise PolicyError(f"vLLM server {self.root}: /collective_rpc answered {body!r}, not results")
        return results

    async def pause(self) -> None:
        """``POST /pause?mode=wait``: running requests finish, new ones wait."""
        await self._call("POST", "/pause", params={"mode": "wait"})

    async def resume(self) -> None:
        """``POST /resume``."""
        await self._call("POST", "/resume")

    async def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache``."""
        await self._call("POST", "/reset_prefix_cache")

    async def set_weight_version(self, version: str) -> None:
        """``POST /update_weight_version``."""
        await self._call("POST", "/update_weight_version", json={"new_version": version})

    async def weight_version(self) -> str | None:
        """``GET /weight_info``: the version the server records."""
        body = await self._call("GET", "/weight_info")
        v = body.get("weight_version") if isinstance(body, Mapping) else None
        return None if v is None else str(v)

    async def config(self) -> dict[str, Any]:
        """``GET /server_info``: the engine's configuration (model, dtype, logprobs mode, extension)."""
        body = await self._call("GET", "/server_info", params={"config_format": "json"})
        cfg = body.get("vllm_config") if isinstance(body, Mapping) else None
        if not isinstance(cfg, dict):
            raise PolicyError(f"vLLM server {self.root}: /server_info has no vllm_config")
        return cfg

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self.client.aclose()


class VLLMServerPolicy:
    """A running ``vllm serve`` as an :class:`~agentrl.protocols.UpdatablePolicy`.

    Args:
        base_url: The server's root URL (``http://127.0.0.1:8000``; a trailing ``/v1`` is accepted).
        model: The served model name (``--served-model-name``).
        stop_token_ids: Ids that end a turn; give the renderer the same.
        tokenizer: Optional; enables the check that the server's text matches its ids (pitfall §15.5).
        weights_dir: A folder both this process and the server read (default :func:`default_weights_dir`).
        version: The version the server's weights hold now.
        timeout: Seconds per generation request.
        lora: The learner's LoRA settings: the server then gets adapters, one per version, instead of
            whole weights (start it with ``server_command(lora_rank=...)``).
        max_live_adapters: With ``lora``: adapter versions loaded at once (``--max-staleness`` + 1; at most
            the server's ``--max-loras``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        stop_token_ids: Sequence[int],
        tokenizer: Any = None,
        weights_dir: str | os.PathLike[str] | None = None,
        version: int = 0,
        timeout: float = 600.0,
        lora: LoraConfig | None = None,
        max_live_adapters: int = 1,
    ):
        if not stop_token_ids:
            raise ConfigError("VLLMServerPolicy needs stop_token_ids (the renderer's)")
        root = base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        if not root.startswith(("http://", "https://")):
            raise ConfigError(f"VLLMServerPolicy needs an http(s) URL, got {base_url!r}")
        self.url = root
        self.engine = HTTPEngineControl(root)
        # Retries would re-send a sampled request after a timeout; the caller's retry policy decides.
        self.completions = OpenAIPolicy(
            root + "/v1",
            model,
            stop_token_ids=stop_token_ids,
            tokenizer=tokenizer,
            timeout=timeout,
            max_retries=0,
            extra_body={"include_stop_str_in_output": True},
            version=version,
        )
        self.weights_dir = Path(weights_dir) if weights_dir is not None else default_weights_dir()
        self.last_push: WeightPush | None = None
        self._gate = UpdateGate()
        self.lora = lora if lora is not None and lora.enabled else None
        self.max_live_adapters = int(max_live_adapters)
        self.adapters: LiveAdapters | None = None  # built by connect(), which reads the server's dtype

    @property
    def version(self) -> int:
        """Version of the weights the server serves (the last update loaded through this policy)."""
        return self.completions.version

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a turn."""
        return self.completions.stop_token_ids

    async def connect(self) -> None:
        """Check that the server is up and configured for faithful token-level sampling.

        Raises:
            PolicyError: the server cannot be reached.
            ConfigError: it runs with settings that would make its log-probs or ids unfaithful.
        """
        cfg = await self.engine.config()
        model_cfg = cfg.get("model_config") or {}
        problems = []
        if model_cfg.get("logprobs_mode") != "processed_logprobs":
            problems.append(
                f"logprobs_mode is {model_cfg.get('logprobs_mode')!r}; start it with --logprobs-mode "
                "processed_logprobs (log-probs after temperature, what the learner recomputes)"
            )
        if model_cfg.get("generation_config") not in ("vllm", None):
            problems.append(
                "it takes default sampling settings from the model's generation_config.json; start it "
                "with --generation-config vllm"
            )
        ext = (cfg.get("parallel_config") or {}).get("worker_extension_cls") or ""
        if not ext.endswith("AgentRLWorkerExtension"):
            problems.append(
                f"its worker extension is {ext!r}; start it with agentrl's (see server_command) to take "
                "weight updates"
            )
        if self.lora is not None:
            lora_cfg = cfg.get("lora_config") or {}
            if not lora_cfg:
                problems.append(f"it serves no LoRA adapters; start it with {_LORA_ENV}")
            elif int(lora_cfg.get("max_loras") or 0) < self.max_live_adapters:
                problems.append(
                    f"its --max-loras is {lora_cfg.get('max_loras')}, fewer than the "
                    f"{self.max_live_adapters} adapter versions this run keeps live (--max-staleness + 1)"
                )
            elif int(lora_cfg.get("max_lora_rank") or 0) < self.lora.rank:
                problems.append(f"its --max-lora-rank {lora_cfg.get('max_lora_rank')} < --lora.rank")
        if problems:
            raise ConfigError(f"vLLM server {self.url}: " + "; ".join(problems))
        if self.lora is not None and self.adapters is None:
            import torch

            from agentrl.policies.vllm_lora import LiveAdapters

            dtype = str(model_cfg.get("dtype") or "float32").removeprefix("torch.")
            self.adapters = LiveAdapters(
                self.engine,
                max_live=self.max_live_adapters,
                alpha=self.lora.alpha,
                dtype=getattr(torch, dtype),  # the server keeps adapters in its model's dtype
                weights_dir=self.weights_dir,
            )

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample one turn (see :meth:`OpenAIPolicy.generate`); waits while new weights load."""
        await self._gate.wait()
        if self.lora is None:
            return await self.completions.generate(prompt_ids, sampling)
        version = self.version
        async with self._live().use(version) as live:  # the turn keeps its version's adapter to the end
            c = self.completions
            client = OpenAIPolicy(
                self.url + "/v1",
                live.push.name,  # the adapter's name is the request's model
                stop_token_ids=c.stop_token_ids,
                tokenizer=c.tokenizer,
                extra_body=c.extra_body,
                version=version,
                client=c.client,
            )
            return await client.generate(prompt_ids, sampling)

    def _live(self) -> LiveAdapters:
        if self.adapters is None:
            raise PolicyError("a LoRA VLLMServerPolicy needs `await policy.connect()` before use")
        return self.adapters

    async def load_weights(self, update: WeightUpdate) -> None:
        """Load ``update`` into the server and take its version (:class:`~agentrl.protocols.WeightSink`).

        Requests running on the server finish with the old weights; generations this policy starts
        meanwhile wait and run with the new ones. On return the server's workers have reported a checksum
        equal to :func:`agentrl.weights.weights_checksum` of ``update.named_tensors``.

        Raises:
            ConfigError: the update is older than the loaded version.
            PolicyError: the server failed or reported another checksum; this policy keeps its version.
        """
        async with self._gate.updating():
            update.check_after(self.version)
            if self.lora is not None:
                await self._live().push(update)  # one adapter per version; older turns keep theirs
                await self.engine.set_weight_version(str(update.version))
            else:
                self.last_push = await push_weights(self.engine, update, self.weights_dir)
            self.completions.set_version(update.version)

    async def served_adapter(self) -> ServedAdapter:
        """The version new turns sample with and the digest of the adapter the server's workers hold for it
        (:func:`agentrl.lora_sync.verify_served` checks it against the learner's after every sync)."""
        return await self._live().served(self.version)

    async def weights_checksum(self) -> str | None:
        """The checksum the server's workers report for the weights they loaded last (None before any
        update: the server still serves the folder it started from)."""
        return await served_checksum(self.engine)

    async def server_version(self) -> int | None:
        """The weights version the server itself records (``GET /weight_info``)."""
        v = await self.engine.weight_version()
        return int(v) if v is not None and v.isdigit() else None

    async def aclose(self) -> None:
        """Close the HTTP connections (the server keeps running)."""
        await self.engine.aclose()
        await self.completions.client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentrl.policies.vllm_server``: run ``vllm serve`` with agentrl's settings (foreground)."""
    from agentrl.models import model_folder

    ap = argparse.ArgumentParser(prog="python -m agentrl.policies.vllm_server", description=main.__doc__)
    ap.add_argument("--python", required=True, help="python of the venv that has vLLM")
    ap.add_argument("--model", default="smollm2", help="'smollm2' or a local model folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default="agentrl")
    ap.add_argument("--dtype", default="float32", help="the learner's dtype (float32 on CPU)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--lora-rank", type=int, default=0, help="serve LoRA adapters of this rank (0: off)")
    ap.add_argument("--max-loras", type=int, default=1, help="adapters loaded at once (--max-staleness + 1)")
    ap.add_argument("vllm_args", nargs="*", help="more vLLM flags, after --")
    ns = ap.parse_args(argv)
    folder = model_folder(ns.model)
    if folder is None:
        raise SystemExit(f"{ns.model!r} has no model folder to serve")
    cmd, env = server_command(
        folder,
        python=ns.python,
        host=ns.host,
        port=ns.port,
        served_model_name=ns.served_model_name,
        dtype=ns.dtype,
        max_model_len=ns.max_model_len,
        extra_args=ns.vllm_args,
        lora_rank=ns.lora_rank,
        max_loras=ns.max_loras,
    )
    print(" ".join(cmd), file=sys.stderr, flush=True)
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    raise SystemExit(main())
