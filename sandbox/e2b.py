"""E2BSandbox: the Sandbox contract on e2b's cloud sandboxes (``e2b-code-interpreter``).

Each E2BSandbox owns one e2b sandbox (a Firecracker microVM running a Jupyter-based code interpreter) and one
code context (kernel) in it; ``reset`` restarts the context, ``close`` kills the VM. Real use needs
``E2B_API_KEY`` and network access to e2b (see ``sandbox/README.md``); offline, point it at the tests' local
stand-in server (``tests/sandbox/e2b_server.py``) with ``debug=True, sandbox_url=server.url``.

What this backend enforces itself, because e2b does not: the wall-clock deadline (an asyncio deadline around
the whole streamed request, not just the SDK's per-read timeout), the per-stream output cap and a hard
output cap (e2b streams output uncapped), the code-size limit, and the mapping of connection failures to
``sandbox_error``. Memory, processes and network are whatever the e2b template gives the VM; e2b
sandboxes have internet access unless created with ``allow_internet_access=False`` (the default here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.execution import ExecResult, Limits
from agentrl.types import ToolStatus

from ._common import SerialBackend
from ._output import Capture

__all__ = ["E2BSandbox"]

log = logging.getLogger(__name__)
MiB = 1024 * 1024

_STATUS_BY_ERROR = {
    "SandboxTimeout": ToolStatus.TIMEOUT,
    "SandboxOutputLimit": ToolStatus.OUTPUT_LIMIT,
    "SandboxKilled": ToolStatus.KILLED,
    "MemoryError": ToolStatus.OOM,
}
_LOSES_STATE = {"SandboxTimeout", "SandboxOutputLimit", "SandboxKilled", "SystemExit"}


class _OutputOverflow(Exception):
    pass


class E2BSandbox(SerialBackend):
    """A stateful Python session in an e2b sandbox.

    Args:
        limits: maximum limits; ``wall_s`` and ``output_bytes`` are enforced here, the rest by the template.
        template: e2b template id (default: the SDK's code-interpreter template).
        lifetime_s: how long e2b keeps the VM alive without calls (its ``timeout``), default 300 s.
        output_hard_cap: total output bytes after which a call is stopped (``output_limit``).
        max_code_bytes: larger code is rejected before any request.
        require_completion: treat a stream that ends without the kernel's execution count (sent with
            ``execute_reply``, the last message of a finished execution) as a dead sandbox
            (``sandbox_error``) rather than a silent success. The SDK itself does not check this.
        sandbox_kwargs: passed to ``AsyncSandbox.create`` (``api_key``, ``domain``, ``debug``,
            ``sandbox_url``, ``metadata``, ``request_timeout``...). ``allow_internet_access`` defaults to
            ``not limits.network``.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        template: str | None = None,
        lifetime_s: int = 300,
        output_hard_cap: int = 16 * MiB,
        max_code_bytes: int = 1 * MiB,
        require_completion: bool = True,
        **sandbox_kwargs: Any,
    ):
        self._limits = limits if limits is not None else Limits()
        if not isinstance(self._limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        self._template = template
        self._lifetime = int(lifetime_s)
        self._hard_cap = int(output_hard_cap)
        self._max_code_bytes = int(max_code_bytes)
        self._require_completion = bool(require_completion)
        sandbox_kwargs.setdefault("allow_internet_access", self._limits.network)
        self._kwargs = sandbox_kwargs
        self._sbx: Any = None
        self._ctx: Any = None
        self._lock: asyncio.Lock | None = None
        self._closed = False
        self._lost_pending = False

    @property
    def limits(self) -> Limits:
        """The most this sandbox grants (per-call limits are clamped to these)."""
        return self._limits

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the e2b sandbox and a code context. Raises SandboxError when e2b is unreachable."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self._sbx is not None:
            return
        try:
            from e2b_code_interpreter import AsyncSandbox
        except ImportError as e:  # pragma: no cover - the [e2b] extra is not installed
            raise SandboxError("E2BSandbox needs `pip install agentrl[e2b]`") from e
        try:
            kwargs = dict(self._kwargs)
            if self._template is not None:
                kwargs["template"] = self._template
            sbx = await AsyncSandbox.create(timeout=self._lifetime, **kwargs)
            self._ctx = await sbx.create_code_context()
        except Exception as e:
            raise SandboxError(f"could not create an e2b sandbox: {type(e).__name__}: {e}") from e
        self._sbx = sbx

    async def reset(self) -> None:
        """Restart the code context: every variable, import and kernel process is gone."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self._sbx is None:
            await self.start()
            return
        try:
            await self._sbx.restart_code_context(self._ctx)
        except Exception as e:
            raise SandboxError(f"could not restart the e2b context: {type(e).__name__}: {e}") from e
        self._lost_pending = False

    async def close(self) -> None:
        """Kill the e2b sandbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        sbx, self._sbx = self._sbx, None
        if sbx is not None:
            with contextlib.suppress(Exception):
                await sbx.remove_code_context(self._ctx)
            try:
                await sbx.kill()
            except Exception as e:
                log.warning("could not kill e2b sandbox %s: %s", getattr(sbx, "sandbox_id", "?"), e)

    async def __aenter__(self) -> E2BSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- running (run: SerialBackend) ---------------------------------------------------------------
    async def _run_locked(self, code: str, limits: Limits, t0: float) -> ExecResult:
        try:
            await self.start()
        except SandboxError as e:
            return ExecResult(ToolStatus.SANDBOX_ERROR, message=str(e), duration_s=time.perf_counter() - t0)
        return await self._execute(code, limits, t0)

    async def _execute(self, code: str, limits: Limits, t0: float) -> ExecResult:
        from e2b import TimeoutException

        out, err = Capture(limits.output_bytes), Capture(limits.output_bytes)

        def feed(cap: Capture, text: str) -> None:
            cap.feed(text.encode("utf-8", "surrogatepass"))
            if out.total + err.total > self._hard_cap:
                raise _OutputOverflow

        try:
            # The SDK's ``timeout`` is a per-read idle bound; the deadline around the whole call is ours.
            async with asyncio.timeout(limits.wall_s):
                execution = await self._sbx.run_code(
                    code,
                    context=self._ctx,
                    timeout=limits.wall_s + 5,
                    on_stdout=lambda m: feed(out, m.line),
                    on_stderr=lambda m: feed(err, m.line),
                )
        except (TimeoutError, TimeoutException) as e:
            if isinstance(e, TimeoutException) and "killed" in str(e):
                return self._infra(f"the e2b sandbox died during the call: {e}", out, err, t0)
            lost = await self._restart_after_failure()
            return self._result(
                ToolStatus.TIMEOUT,
                out,
                err,
                t0,
                state_lost=True,
                message=f"Timed out after {limits.wall_s:g} s."
                + (" The session was restarted and its state was lost." if lost else ""),
            )
        except _OutputOverflow:
            await self._restart_after_failure()
            return self._result(
                ToolStatus.OUTPUT_LIMIT,
                out,
                err,
                t0,
                state_lost=True,
                message=f"The code wrote more than {self._hard_cap // MiB} MiB of output and was stopped. "
                "The session was restarted and its state was lost.",
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # connection refused/reset, 404 sandbox not found, 5xx: infrastructure
            return self._infra(f"{type(e).__name__}: {e}", out, err, t0)
        if self._require_completion and execution.execution_count is None:
            return self._infra("the e2b stream ended before the execution finished", out, err, t0)
        for res in execution.results:
            if getattr(res, "is_main_result", False) and res.text is not None:
                feed(out, res.text + "\n")
        error = execution.error
        if error is None:
            status, message, lost = ToolStatus.OK, "", False
        else:
            status = _STATUS_BY_ERROR.get(error.name, ToolStatus.ERROR)
            lost = error.name in _LOSES_STATE or (error.name == "MemoryError" and "restarted" in error.value)
            if error.name == "SandboxError":
                return self._infra(error.value, out, err, t0)
            message = error.value if error.name in _STATUS_BY_ERROR or error.name == "SystemExit" else ""
            tb = error.traceback or f"{error.name}: {error.value}\n"
            if tb not in err_text(err):
                with contextlib.suppress(_OutputOverflow):
                    feed(err, tb if tb.endswith("\n") else tb + "\n")
        return self._result(status, out, err, t0, state_lost=lost, message=message)

    async def _restart_after_failure(self) -> bool:
        try:
            await self._sbx.restart_code_context(self._ctx)
            return True
        except Exception as e:
            log.warning("could not restart the e2b context after a failure: %s", e)
            return False

    def _infra(self, detail: str, out: Capture, err: Capture, t0: float) -> ExecResult:
        return self._result(
            ToolStatus.SANDBOX_ERROR,
            out,
            err,
            t0,
            state_lost=True,
            message="Sandbox failure (not the code's fault): " + detail,
        )

    @staticmethod
    def _result(
        status: ToolStatus, out: Capture, err: Capture, t0: float, *, state_lost: bool, message: str
    ) -> ExecResult:
        return ExecResult(
            status=status,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.perf_counter() - t0,
            truncated=out.truncated or err.truncated,
            state_lost=state_lost,
            message=message,
        )


def err_text(cap: Capture) -> str:
    return cap.text()
