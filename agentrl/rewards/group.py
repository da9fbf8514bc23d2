"""Group-wise rewards: the members of a complete group judged together, RULER-style.

:class:`RelativeReward` is a :data:`agentrl.rollout.GroupHook`: the scheduler hands it each group once every
member has finished, before any member is stored or credited (``finish_group``). It puts the members' answers
to the one question in a single :class:`~agentrl.rewards.RelativeJudge` prompt, and adds each judged member's
score to its last step as the reward term ``relative`` (its judge call recorded with it, on every member), so
the stored trajectories, the step metrics (``reward/term/relative``) and the group baseline all see the
judged rewards. A judge that fails raises :class:`~agentrl.errors.JudgeError`; the scheduler then records
every member as an infrastructure failure (never rewarded 0).

Which members are judged: episodes without an infrastructure failure whose last sample handed an answer to
the env (a turn cut mid-way never reached ``step``, and keeps the env's reward). The question is the first
user message of the episode; the answer, the text of its last action. Candidates go into the prompt in the
order of their episode ids, so ``agentrl replay --rescore`` rebuilds the same prompt from the record (and,
on the run's judge cache, sends no request).
"""

from __future__ import annotations

import dataclasses

from agentrl.groups import TrajectoryGroup
from agentrl.reward_records import RewardTerm
from agentrl.types import Trajectory

from .rubric import RelativeJudge

__all__ = ["RelativeReward", "with_term"]


def with_term(traj: Trajectory, term: RewardTerm) -> Trajectory:
    """``traj`` with ``term`` added to its last step: the term stamped with that step's turn, its value
    (``weight * score``) added to that step's reward."""
    if not traj.rewards:
        raise ValueError("a trajectory without a step has no reward to add a term to")
    term = dataclasses.replace(term, turn=len(traj.rewards) - 1)
    rewards = (*traj.rewards[:-1], traj.rewards[-1] + term.value)
    return dataclasses.replace(traj, rewards=rewards, reward_terms=(*traj.reward_terms, term))


def _question(t: Trajectory) -> str:
    return next((m.content for m in t.messages if m.role == "user"), "")


class RelativeReward:
    """Judges a complete group's answers together and adds each score as a reward term (a ``GroupHook``).

    Args:
        judge: The group judge (one prompt per group, one score per member).
        name: The reward term's name (its step metric is ``reward/term/<name>``).
        weight: The term's weight in the reward.
    """

    def __init__(self, judge: RelativeJudge, *, name: str = "relative", weight: float = 1.0):
        self.judge, self.name, self.weight = judge, name, weight

    async def terms(self, group: TrajectoryGroup) -> dict[int, RewardTerm]:
        """The term of each judged member, by the position of its last sample in ``group``.

        Raises:
            JudgeError: the judge gave no readable answer (an infrastructure failure).
        """
        cands: list[tuple[str, int, int]] = []  # (episode id, order, position of the last sample)
        pos = 0
        for k, episode in enumerate(group.episodes):
            pos += len(episode)
            last = episode[-1]
            if not any(s.infra_failure for s in episode) and last.actions and last.rewards:
                cands.append((last.meta.episode_id, k, pos - 1))
        if not cands:
            return {}
        cands.sort()
        trajs = group.trajectories
        question = _question(group.episodes[cands[0][1]][0])
        grades = await self.judge.score_group(question, [trajs[p].actions[-1] for _, _, p in cands])
        return {p: g.term(self.name, self.weight) for (_, _, p), g in zip(cands, grades, strict=True)}

    async def __call__(self, group: TrajectoryGroup) -> TrajectoryGroup:
        """``group`` with each judged member's term added to its last step (the scheduler's hook)."""
        terms = await self.terms(group)
        if not terms:
            return group
        return TrajectoryGroup(
            tuple(with_term(t, terms[p]) if p in terms else t for p, t in enumerate(group.trajectories))
        )
