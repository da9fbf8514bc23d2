"""``judged-v0``: short writing tasks with no exact answer, rewarded by a judge model or a rubric.

One turn: the model gets an instruction ("Describe the sea in one sentence.") and answers; the reward is the
rubric's weighted score of the answer (``agentrl.rewards``), each criterion recorded as a reward term with
its judge calls. The rubric comes from ``reward`` (a :class:`~agentrl.rewards.RewardConfig`, which
``agentrl train --reward.judge-url URL --reward.judge-model NAME`` or ``--reward.rubric FILE`` passes) or is
given directly (``rubric=``). A judge that fails raises :class:`~agentrl.errors.JudgeError`, so the episode
is dropped as an infrastructure failure (stop reason ``judge_error``), never rewarded 0.

With ``--reward.relative-judge true --reward.judge-url URL`` the judge scores whole groups instead (the
trainer's group hook, :class:`~agentrl.rewards.RelativeReward`): the env then asks no judge and returns
reward 0, and each answer's reward is the term ``relative`` the hook adds once its group is complete.
"""

from __future__ import annotations

from typing import Any

from agentrl import Action, Env, Message, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.rewards import RewardConfig, Rubric

__all__ = ["TOPICS", "JudgedEnv"]

TOPICS = (
    "the sea",
    "a rainy morning",
    "a busy market",
    "an old library",
    "a mountain at night",
    "a train station",
    "a garden in spring",
    "a desert road",
)
"""What the instructions are about (the seed picks one, and one of the :data:`FORMS`)."""

FORMS = (
    "Describe {topic} in one sentence.",
    "Write a two-line poem about {topic}.",
    "Give one practical tip for someone visiting {topic}.",
)


class JudgedEnv(Env):
    """A one-turn writing task scored by a rubric of judges and functions.

    Args:
        reward: The run's ``--reward.*`` settings (the trainer passes them).
        rubric: A rubric to score with instead (in Python).
        system_prompt: The system message.
    """

    def __init__(
        self,
        reward: RewardConfig | dict[str, Any] | None = None,
        *,
        rubric: Rubric | None = None,
        system_prompt: str = "You are a helpful writer. Answer briefly.",
    ):
        if rubric is None:
            cfg = RewardConfig(**reward) if isinstance(reward, dict) else reward
            if cfg is None or not cfg.enabled:
                raise ConfigError(
                    "judged-v0 needs a judge: --reward.judge-url URL --reward.judge-model NAME, "
                    "--reward.rubric FILE, or JudgedEnv(rubric=...)"
                )
            rubric = cfg.rubric_for_run() if cfg.per_answer else None  # None: the group judge scores
        self.rubric: Rubric | None = rubric
        self.system_prompt = system_prompt
        self.question = ""

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Draw the instruction for ``seed``."""
        self.seed(seed)
        self.question = self.rng.choice(FORMS).format(topic=self.rng.choice(TOPICS))
        obs = (Message("system", self.system_prompt), Message("user", self.question))
        return obs, {"question": self.question}

    async def step(self, action: Action) -> StepResult:
        """Score the answer with the rubric (0 when only its group is judged); the episode ends after one
        turn."""
        if self.rubric is None:
            return StepResult(reward=0.0, terminated=True)
        result = await self.rubric.score({"question": self.question, "answer": action.text.strip()})
        return StepResult(reward=result.reward, terminated=True, reward_terms=result.terms)
