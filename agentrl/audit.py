"""The token audit: a trajectory's ids, mask, log-probs, provenance and messages must agree.

:func:`audit_trajectory` runs on every trajectory in agentrl's tests and, with ``RolloutConfig(audit=True)``,
on every rollout. It raises :class:`~agentrl.errors.AuditError` naming the first broken invariant:

* the three columns have one length; log-probs exist exactly where the mask is 1; segments tile the ids and
  the mask is 1 exactly on ``MODEL`` segments (:meth:`Trajectory.validate`);
* every id is in the tokenizer's vocabulary;
* stop tokens appear in a model turn only as its last token, and a model turn followed by more tokens
  ends with a stop token — a control token anywhere else means the engine's ids are wrong (pitfall §15.5);
* a model turn cut by length is masked in as sampled, is the last thing in the trajectory, and the
  trajectory is marked truncated (pitfall §15.6);
* decoding a model segment gives the recorded assistant text (when the env parsed tool calls out of it, the
  parsed content and each tool name must still be in the decoded text);
* observation and prompt segments decode to text containing their message's content;
* the response length (``num_model_tokens``) counts model tokens only.

:func:`recompute_logprobs` re-scores a trajectory with one forward pass, for checking a sampler's log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentrl.errors import AuditError
from agentrl.types import Message, TokenSource, Trajectory

if TYPE_CHECKING:
    from agentrl.chat import ChatRenderer

__all__ = ["audit_trajectory", "recompute_logprobs"]


def audit_trajectory(traj: Trajectory, renderer: ChatRenderer | Any) -> None:
    """Check every token-stream invariant of ``traj``; raise :class:`AuditError` on the first violation.

    Args:
        traj: The trajectory to check.
        renderer: The :class:`~agentrl.chat.ChatRenderer` that produced it (or a Hugging Face tokenizer,
            from which a renderer with default stop tokens is built).
    """
    from agentrl.chat import ChatRenderer

    r = renderer if isinstance(renderer, ChatRenderer) else ChatRenderer(renderer)
    traj.validate()
    ids = traj.token_ids
    for i, t in enumerate(ids):
        if not 0 <= t < r.vocab_size:
            raise AuditError(f"token {i} has id {t}, outside the vocabulary [0, {r.vocab_size})")

    model_segs = [(k, s) for k, s in enumerate(traj.segments) if s.source is TokenSource.MODEL]
    n_model = sum(s.end - s.start for _, s in model_segs)
    if traj.num_model_tokens != n_model:
        raise AuditError(f"response length {traj.num_model_tokens} != {n_model} tokens in model segments")
    seen_messages: set[int] = set()
    for n, (k, s) in enumerate(model_segs):
        seg_ids = ids[s.start : s.end]
        where = f"model turn {s.turn} (tokens [{s.start}, {s.end}))"
        for j, t in enumerate(seg_ids[:-1]):
            if r.is_stop(t):
                raise AuditError(
                    f"{where}: stop token {t} ({r.decode([t])!r}) at position {s.start + j}, before the "
                    "turn's end: the engine's ids do not match where sampling stopped (pitfall §15.5)"
                )
        ends_with_stop = bool(seg_ids) and r.is_stop(seg_ids[-1])
        is_last = n == len(model_segs) - 1
        followed = k < len(traj.segments) - 1
        if not ends_with_stop:
            if followed:
                raise AuditError(
                    f"{where}: the turn ends without a stop token ({r.decode(seg_ids[-1:])!r}) yet the "
                    "conversation goes on; a wrong control-token id or an unmarked truncation"
                )
            if is_last and not traj.infra_failure and not traj.stop_reason.is_token_limit:
                raise AuditError(
                    f"{where}: the last turn was cut by length (no stop token) but the trajectory says "
                    f"stop_reason={traj.stop_reason.value}, truncated={traj.truncated} (pitfall §15.6)"
                )
        if is_last and traj.stop_reason.is_token_limit and not traj.truncated:
            raise AuditError(f"stop_reason={traj.stop_reason.value} but truncated is False")
        if s.message_index is None:
            raise AuditError(f"{where}: no message index; every model turn must map to its message")
        if s.message_index in seen_messages:
            raise AuditError(f"{where}: message {s.message_index} already has a model segment")
        seen_messages.add(s.message_index)
        msg = _message(traj, s.message_index, where)
        if msg.role != "assistant":
            raise AuditError(f"{where}: maps to a {msg.role!r} message, not an assistant message")
        body = seg_ids[:-1] if ends_with_stop else seg_ids
        text = r.decode(body)
        if msg.tool_calls:
            if msg.content.strip() and msg.content.strip() not in text:
                raise AuditError(
                    f"{where}: the parsed assistant content {msg.content[:60]!r} is not in the sampled "
                    f"text {text[:120]!r}"
                )
            for call in msg.tool_calls:
                if call.name not in text:
                    raise AuditError(f"{where}: tool call {call.name!r} does not appear in the sampled text")
        elif text != msg.content:
            raise AuditError(
                f"{where}: the sampled tokens decode to {text[:80]!r} but the recorded assistant text is "
                f"{msg.content[:80]!r}"
            )

    for s in traj.segments:
        if s.source in (TokenSource.OBSERVATION, TokenSource.PROMPT) and s.message_index is not None:
            where = f"{s.source.value} segment of turn {s.turn} (tokens [{s.start}, {s.end}))"
            msg = _message(traj, s.message_index, where)
            if msg.role == "assistant" and s.source is TokenSource.OBSERVATION:
                raise AuditError(f"{where}: an observation segment maps to an assistant message")
            text = r.decode(ids[s.start : s.end])
            if msg.content and msg.content not in text:
                raise AuditError(
                    f"{where}: decodes to {text[:80]!r}, which does not contain message "
                    f"{s.message_index}'s content {msg.content[:60]!r}"
                )
        if s.source is TokenSource.OBSERVATION and s.turn < 0:
            raise AuditError(f"observation tokens [{s.start}, {s.end}) belong to no model turn")


def _message(traj: Trajectory, index: int, where: str) -> Message:
    if not 0 <= index < len(traj.messages):
        raise AuditError(f"{where}: message index {index} is out of range ({len(traj.messages)} messages)")
    return traj.messages[index]


def recompute_logprobs(
    model: Any, token_ids: Sequence[int], *, temperature: float = 1.0, device: Any = None
) -> list[float]:
    """Log-prob of each token given the ones before it, from one forward pass (``[0]`` is 0.0).

    Uses ``log_softmax(logits / temperature)``, the distribution :class:`~agentrl.policies.HFPolicy`
    samples from (with ``top_p=1``).
    """
    import torch

    dev = device if device is not None else next(model.parameters()).device
    x = torch.tensor([list(token_ids)], dtype=torch.long, device=dev)
    with torch.no_grad():
        logits_T_V = model(input_ids=x).logits[0].float()
    logp_T_V = torch.log_softmax(logits_T_V[:-1] / temperature, dim=-1)
    out = logp_T_V.gather(-1, x[0, 1:, None]).squeeze(-1)
    return [0.0, *out.tolist()]
