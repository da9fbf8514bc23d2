"""Trainers and the ``agentrl`` command (``trainers/`` in the repository, installed as ``agentrl.trainers``).

:mod:`~agentrl.trainers.pg` is the policy-gradient trainer (``agentrl train``), :mod:`~agentrl.trainers.cli`
the command line, :mod:`~agentrl.trainers.evaluate` ``agentrl eval``; :mod:`~agentrl.trainers.replay`
re-runs recorded episodes and :mod:`~agentrl.trainers.gateway` serves the recording gateway. Nothing in the
library imports this package.
"""
