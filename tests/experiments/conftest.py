"""The reproduction scripts live in experiments/otb_reproduction (not an installed package): import them
from there."""

import sys
from pathlib import Path

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "otb_reproduction"
if str(EXPERIMENT) not in sys.path:
    sys.path.insert(0, str(EXPERIMENT))
