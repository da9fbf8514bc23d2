"""``python -m agentrl.trainers``: the same as the ``agentrl`` command."""

import sys

from agentrl.trainers.cli import main

sys.exit(main())
