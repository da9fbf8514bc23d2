"""The rollout tests use the suite-wide ``tok`` and ``renderer`` fixtures of tests/conftest.py."""
