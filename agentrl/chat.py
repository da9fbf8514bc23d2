r"""Chat-template rendering as token deltas, with a runtime check that the template is append-only.

The rollout never re-tokenizes what the model sampled (pitfall §15.1). It needs token ids for everything
*else*: the initial prompt, and after each model turn the new environment/tool messages plus the next
generation prompt. :class:`ChatRenderer` gets those from the model's own chat template, rendered as a
*delta*:

1. The assistant turn is rendered with the decoded sampled text as its content (never the env's parsed
   message, which may rewrite the content around tool calls — pitfall §15.2).
2. ``render_all(history + assistant + new_messages, add_generation_prompt=True)`` must start with the text
   of the prompt already fed to the model, followed by the sampled text. If it does not, the template is
   not append-only for this conversation (pitfall §15.4: e.g. it drops earlier reasoning) and
   :class:`~agentrl.errors.TemplateError` is raised; the rollout then stops or raises as configured.
3. What follows the sampled end-of-turn token up to the first new message (``"\n"`` after ``<|im_end|>``
   in ChatML) was inserted by the template and never sampled: it becomes a ``TEMPLATE`` piece (mask 0, no
   log-prob; pitfall §15.3). The new messages become ``OBSERVATION`` pieces, the next generation prompt a
   ``TEMPLATE`` piece.
4. The delta is tokenized once, and checked at two levels: *text* — decoding prefix + sampled + delta gives
   exactly the one-pass render; *tokens* — the delta's ids equal the tail of the in-context tokenization of
   the same text (no BPE merge across the boundary).

When a generation ends by length (no stop token) and the conversation goes on, the template's own
end-of-turn text (``<|im_end|>``) becomes part of the ``TEMPLATE`` piece: the model did not sample it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError, TemplateError
from agentrl.masking import Piece
from agentrl.tokenizer_id import TokenizerInfo, tokenizer_info
from agentrl.types import Message, TokenSource

__all__ = ["ChatRenderer", "RenderedPrompt", "TurnDelta"]

_END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|return|>",
)
"""End-of-turn / end-of-text tokens of common chat formats; those present as added tokens are stop ids."""

_TOKEN_CHECK_WINDOW = 64
"""Characters of left context used to check that the delta tokenizes the same in context."""


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """The initial prompt as token ids, with per-message provenance."""

    token_ids: tuple[int, ...]
    """The prompt's ids, ending with the generation prompt."""
    text: str
    """The rendered text (``decode(token_ids)``)."""
    pieces: tuple[Piece, ...]
    """``PROMPT`` pieces, one per message (``message_index`` counted from 0) plus the generation prompt."""


@dataclass(frozen=True, slots=True)
class TurnDelta:
    """What follows one model turn: template separator, observation messages, next generation prompt."""

    pieces: tuple[Piece, ...]
    """``TEMPLATE`` / ``OBSERVATION`` pieces in order (none of them sampled)."""
    token_ids: tuple[int, ...]
    """All ids of :attr:`pieces`, concatenated."""
    text: str
    """The full conversation text after the delta (the next prompt, decoded)."""
    assistant_text: str
    """The model turn's text as rendered into the conversation: the sampled text without its stop token,
    or with it when the template closes turns with a different token. Render later turns with it."""


class ChatRenderer:
    """Renders a chat with a Hugging Face tokenizer's chat template, as append-only token deltas.

    Args:
        tokenizer: A Hugging Face tokenizer (a fast one gives exact per-message provenance via offsets).
        chat_template: Override the tokenizer's template (a Jinja string).
        template_kwargs: Extra variables for the template (e.g. ``{"enable_thinking": False}``).
        stop_token_ids: Ids that end a model turn. Default: the tokenizer's EOS plus whichever of the
            common end-of-turn tokens (``<|im_end|>``, ``<|eot_id|>``, ``<|endoftext|>``...) it has.
        check_tokens: Also check the delta at token level (in-context tokenization). On by default.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        stop_token_ids: Sequence[int] | None = None,
        check_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        if not template or not isinstance(template, str):
            raise ConfigError(
                "the tokenizer has no chat template; pass chat_template= (a Jinja string) to ChatRenderer"
            )
        self.chat_template: str = template
        self.template_kwargs = dict(template_kwargs or {})
        self.check_tokens = check_tokens
        self._backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(
            tokenizer, "_tokenizer", None
        )
        if not hasattr(self._backend, "encode"):
            self._backend = None
        self.vocab_size: int = len(tokenizer)
        if stop_token_ids is None:
            stop_token_ids = _default_stop_ids(tokenizer)
        if not stop_token_ids:
            raise ConfigError("no stop token ids: the tokenizer has no EOS; pass stop_token_ids=")
        for t in stop_token_ids:
            if not (isinstance(t, int) and 0 <= t < self.vocab_size):
                raise ConfigError(f"stop token id {t!r} is not in the vocabulary (size {self.vocab_size})")
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys(stop_token_ids))
        """Ids that end a model turn (pass them to the policy)."""
        self._stop_set = frozenset(self.stop_token_ids)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id: int | None = eos if isinstance(eos, int) else None
        """The tokenizer's end-of-sequence id."""
        special = getattr(tokenizer, "all_special_ids", None) or ()
        self.special_token_ids: frozenset[int] = frozenset(int(t) for t in special)
        """Control tokens of the tokenizer (BOS, EOS, ChatML markers...)."""
        self._special_map = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
        self._render_fn = _make_render_fn(self.chat_template)
        self._history_policy: str | None = None
        self._gen_prompt = self._generation_prompt_text()

    @property
    def tokenizer_info(self) -> TokenizerInfo | None:
        """The tokenizer's identity (name, vocabulary size, fingerprint), recorded with each trajectory."""
        return tokenizer_info(self.tokenizer)

    @property
    def history_policy(self) -> str:
        """How the template shows an earlier turn once the conversation goes on (a deployment's view).

        A deployment that re-renders the chat shows the model this, next to the token stream it sampled from:

        * ``"verbatim"``: an earlier turn is rendered as it was sampled, reasoning included;
        * ``"strips_reasoning"``: a turn's ``<think>`` block is dropped once a new user message follows
          (Qwen3, DeepSeek). The rollout keeps the tokens the model saw and raises TemplateError at such
          a turn (not append-only), so training never silently mixes the two views;
        * ``"refuses"``: the template does not render sampled text as an assistant message at all
          (gpt-oss's refuses harmony tags in ``content``).

        Recorded in each trajectory (``meta.extra["template_history"]``); docs/fidelity.md has the
        per-template table.
        """
        if self._history_policy is None:
            policy = "verbatim"
            # Reasoning as <think> (Qwen3, DeepSeek) and as harmony's analysis channel (gpt-oss).
            for turn in (
                "<think>\nagentrl-probe\n</think>\n\nb",
                "<|channel|>analysis<|message|>agentrl-probe<|end|><|start|>assistant<|channel|>final<|message|>b",
            ):
                probe = [Message("user", "a"), Message("assistant", turn), Message("user", "c")]
                try:
                    text = self.render_text(probe, add_generation_prompt=True)
                except TemplateError:
                    policy = "refuses"
                    break
                if "agentrl-probe" not in text:
                    policy = "strips_reasoning"
                    break
            self._history_policy = policy
        return self._history_policy

    def _generation_prompt_text(self) -> str | None:
        """The text ``add_generation_prompt`` appends, if it does not depend on the conversation."""
        texts = set()
        for probe in (
            [Message("user", "x")],
            [Message("user", "x"), Message("assistant", "y"), Message("user", "z")],
        ):
            try:
                with_gen = self.render_text(probe, add_generation_prompt=True)
                without = self.render_text(probe, add_generation_prompt=False)
            except TemplateError:
                return None
            if not with_gen.startswith(without):
                return None
            texts.add(with_gen[len(without) :])
        return texts.pop() if len(texts) == 1 else None

    # ------------------------------------------------------------------------------------------
    # primitives
    def render_text(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool,
    ) -> str:
        """One-pass render of ``messages`` with the chat template, as text."""
        dicts = [m.to_dict() for m in messages]
        kwargs = {**self._special_map, **self.template_kwargs}
        try:
            text: str = self._render_fn(
                dicts, list(tools) if tools else None, add_generation_prompt, kwargs, self.tokenizer
            )
            return text
        except Exception as e:  # jinja raise_exception(), TypeError from odd templates
            raise TemplateError(f"the chat template failed to render {len(dicts)} messages: {e}") from e

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added; the template already has them)."""
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
        if self._backend is not None:
            enc = self._backend.encode(text, add_special_tokens=False)
            return list(enc.ids), list(enc.offsets)
        return self.encode(text), None

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens kept, no clean-up (so that it round-trips)."""
        if self._backend is not None:
            return str(self._backend.decode(list(token_ids), skip_special_tokens=False))
        return str(
            self.tokenizer.decode(
                list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def split_stop(self, sampled_ids: Sequence[int]) -> tuple[tuple[int, ...], int | None]:
        """``(ids without a trailing stop token, that stop token or None)``."""
        ids = tuple(sampled_ids)
        if ids and ids[-1] in self._stop_set:
            return ids[:-1], ids[-1]
        return ids, None

    def assistant_text(self, sampled_ids: Sequence[int]) -> str:
        """The model turn's text as the environment sees it: the sampled ids decoded, stop token removed."""
        body, _ = self.split_stop(sampled_ids)
        return self.decode(body)

    def is_stop(self, token_id: int) -> bool:
        """True when ``token_id`` is one of :attr:`stop_token_ids` (it ends a model turn)."""
        return token_id in self._stop_set

    # ------------------------------------------------------------------------------------------
    # prompt and deltas
    def render_prompt(
        self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> RenderedPrompt:
        """Render the initial messages with the generation prompt; one ``PROMPT`` piece per message."""
        if not messages:
            raise ConfigError("the initial observation has no messages to render")
        text = self.render_text(messages, tools=tools, add_generation_prompt=True)
        # Per-message boundaries come from rendering growing prefixes of the conversation; a prefix that
        # does not render as a prefix of the whole (rare) just merges into the next message's run.
        regions: list[tuple[int, TokenSource, int | None]] = []
        for j in range(1, len(messages) + 1):
            try:
                part = self.render_text(messages[:j], tools=tools, add_generation_prompt=False)
            except TemplateError:
                continue
            if text.startswith(part) and (not regions or len(part) > regions[-1][0]):
                regions.append((len(part), TokenSource.PROMPT, j - 1))
        if not regions or regions[-1][0] < len(text):
            regions.append((len(text), TokenSource.PROMPT, None))
        ids, pieces = self._tokenize_regions(text, regions, turn=-1)
        back = self.decode(ids)
        if back != text:
            raise TemplateError(
                f"the prompt does not round-trip through the tokenizer: {_first_diff(text, back)}"
            )
        return RenderedPrompt(tuple(ids), text, tuple(pieces))

    def render_delta(
        self,
        history: Sequence[Message],
        prefix_ids: Sequence[int],
        prefix_text: str,
        sampled_ids: Sequence[int],
        new_messages: Sequence[Message],
        *,
        turn: int,
        first_message_index: int | None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> TurnDelta:
        """The tokens that follow model turn ``turn``: separator, new messages, next generation prompt.

        Args:
            history: The conversation as rendered so far (earlier assistant turns carry their sampled text).
            prefix_ids: Token ids fed to the model for this turn.
            prefix_text: Their text (the one-pass render of ``history`` with the generation prompt).
            sampled_ids: What the model sampled this turn (with its stop token, if any).
            new_messages: The environment's reply.
            turn: Model turn index (for provenance).
            first_message_index: Trajectory message index of ``new_messages[0]``.
            tools: Tool schemas, as passed to :meth:`render_prompt`.

        Raises:
            TemplateError: the template is not append-only here (names the first differing character) or
                the delta would tokenize differently in context.
        """
        body, stop = self.split_stop(sampled_ids)
        content = self.decode(body)
        stop_text = self.decode([stop]) if stop is not None else ""
        convo, full, after = self._render_turn(
            history, content, new_messages, prefix_text, turn=turn, tools=tools
        )
        consumed = bool(stop_text) and after.startswith(stop_text)
        if stop_text and not consumed:
            # The model stopped on a token the template does not write there (e.g. <|endoftext|> where
            # ChatML closes with <|im_end|>). It stays in the stream as sampled, so the turn's rendered
            # text includes it; the template's own closing follows as TEMPLATE tokens.
            content += stop_text
            convo, full, after = self._render_turn(
                history, content, new_messages, prefix_text, turn=turn, tools=tools
            )
        if consumed:
            after = after[len(stop_text) :]
        # ``after`` is what the template puts after the sampled tokens. Its first part, up to the first new
        # message, is the separator: find it by rendering the conversation that ends with the assistant.
        base = len(prefix_text) + len(content) + (len(stop_text) if consumed else 0)
        sep_end = 0
        try:
            closed = self.render_text(convo, tools=tools, add_generation_prompt=False)
        except TemplateError:
            closed = ""
        if full.startswith(closed) and len(closed) > base:
            sep_end = len(closed) - base
        regions: list[tuple[int, TokenSource, int | None]] = []
        if sep_end:
            regions.append((sep_end, TokenSource.TEMPLATE, None))
        for j in range(1, len(new_messages) + 1):
            mi = None if first_message_index is None else first_message_index + j - 1
            if j == len(new_messages) and self._gen_prompt and full.endswith(self._gen_prompt):
                # The last message ends where the (conversation-independent) generation prompt starts:
                # one render saved per turn. Only provenance depends on it, not the ids.
                end = len(full) - len(self._gen_prompt) - base
                if end > (regions[-1][0] if regions else 0):
                    regions.append((end, TokenSource.OBSERVATION, mi))
                continue
            try:
                part = self.render_text([*convo, *new_messages[:j]], tools=tools, add_generation_prompt=False)
            except TemplateError:
                continue
            end = len(part) - base
            if full.startswith(part) and end > (regions[-1][0] if regions else 0):
                regions.append((end, TokenSource.OBSERVATION, mi))
        if not regions or regions[-1][0] < len(after):
            regions.append((len(after), TokenSource.TEMPLATE, None))
        ids, pieces = self._tokenize_regions(after, regions, turn=turn)

        # Text level: the token stream decodes to the one-pass render.
        got = self.decode([*prefix_ids, *sampled_ids, *ids])
        if got != full:
            raise TemplateError(
                f"after turn {turn}, prefix + sampled + delta does not decode to the one-pass render "
                f"({_first_diff(full, got)})"
            )
        # Token level: the delta's ids equal the tail of the in-context tokenization of the same text.
        if self.check_tokens and ids:
            left = full[: len(full) - len(after)][-_TOKEN_CHECK_WINDOW:]
            in_context = self.encode(left + after)
            if in_context[-len(ids) :] != ids:
                raise TemplateError(
                    f"after turn {turn}, the observation tokenizes differently in context than alone "
                    f"(a BPE merge across the turn boundary): alone {ids[:8]}..., in context "
                    f"{in_context[-len(ids) :][:8]}..."
                )
        return TurnDelta(tuple(pieces), tuple(ids), full, content)

    def _render_turn(
        self,
        history: Sequence[Message],
        content: str,
        new_messages: Sequence[Message],
        prefix_text: str,
        *,
        turn: int,
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> tuple[list[Message], str, str]:
        """One-pass render with the assistant turn ``content``; checks that it extends the prompt the model
        saw and keeps the turn's text. Returns the conversation, the full text and the text after the turn."""
        convo = [*history, Message("assistant", content)]
        full = self.render_text([*convo, *new_messages], tools=tools, add_generation_prompt=True)
        if not full.startswith(prefix_text):
            raise TemplateError(
                f"chat template is not append-only after turn {turn}: re-rendering the conversation "
                f"changes the prompt the model already saw ({_first_diff(prefix_text, full)})"
            )
        rest = full[len(prefix_text) :]
        if not rest.startswith(content):
            raise TemplateError(
                f"chat template rewrites the model's turn {turn} when rendering it "
                f"({_first_diff(content, rest[: len(content) + 20])})"
            )
        return convo, full, rest[len(content) :]

    # ------------------------------------------------------------------------------------------
    def _tokenize_regions(
        self,
        text: str,
        regions: Sequence[tuple[int, TokenSource, int | None]],
        *,
        turn: int,
    ) -> tuple[list[int], list[Piece]]:
        """Tokenize ``text`` once and cut the ids into pieces at the region ends (character offsets).

        A token is assigned to the region its first character falls in. Without offsets (slow
        tokenizers) each region is tokenized on its own; the token-level check catches any difference.
        """
        ids, offsets = self._encode_offsets(text)
        pieces: list[Piece] = []
        if offsets is None:
            ids = []
            start = 0
            for end, source, mi in regions:
                part = self.encode(text[start:end])
                ids.extend(part)
                pieces.append(Piece(source, tuple(part), turn, mi))
                start = end
            return ids, pieces
        r = 0
        current: list[int] = []
        for tid, (s, _e) in zip(ids, offsets, strict=True):
            while r < len(regions) - 1 and s >= regions[r][0]:
                _, source, mi = regions[r]
                pieces.append(Piece(source, tuple(current), turn, mi))
                current = []
                r += 1
            current.append(tid)
        while r < len(regions):
            _, source, mi = regions[r]
            pieces.append(Piece(source, tuple(current), turn, mi))
            current = []
            r += 1
        return ids, pieces


def _first_diff(a: str, b: str) -> str:
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    lo, hi = max(0, i - 20), i + 20
    return f"first difference at char {i}: expected {a[lo:hi]!r}, got {b[lo:hi]!r}"


def _default_stop_ids(tokenizer: Any) -> list[int]:
    out: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        out.append(eos)
    added = getattr(tokenizer, "get_added_vocab", None)
    vocab = added() if callable(added) else {}
    for tok in _END_OF_TURN_TOKENS:
        tid = vocab.get(tok)
        if isinstance(tid, int):
            out.append(tid)
    return out


def _make_render_fn(template: str) -> Any:
    """A fast renderer with transformers' own sandboxed Jinja environment, so the output is identical to
    ``apply_chat_template(..., tokenize=False)`` (tested). Our messages are plain JSON dicts already, so
    the compiled template is called directly, skipping transformers' per-call input sanitizing (which
    costs more than the render itself). Falls back to ``render_jinja_template``, then to
    ``apply_chat_template``, when transformers' internals move."""
    compiled: Any = None
    render_jinja_template: Any = None
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        compiled = _compile_jinja_template(template)
    except Exception:  # pragma: no cover - transformers internals moved
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError:
            render_jinja_template = None

    def render(
        messages: list[dict[str, Any]],
        tools: list[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        kwargs: dict[str, Any],
        tokenizer: Any,
    ) -> str:
        if compiled is not None:
            return str(
                compiled.render(
                    messages=messages,
                    tools=tools,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **kwargs,
                )
            )
        if render_jinja_template is not None:  # pragma: no cover
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
            return str(rendered[0])
        return str(  # pragma: no cover
            tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **{k: v for k, v in kwargs.items() if k not in tokenizer.special_tokens_map},
            )
        )

    return render
