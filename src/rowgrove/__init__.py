"""rowgrove: exact, fairly weighted training rows for agentic RL.

A capture gateway records what the model sampled for every call of an agent; reassembly turns a
finished rollout into rows; `rowgrove.algo` weighs them so that no row split changes a rollout's
say in the update.
"""

from rowgrove.errors import InputError, RowgroveError
from rowgrove.types import Call, Rollout, Row

__version__ = "0.1.0"
__all__ = ["Call", "InputError", "Rollout", "Row", "RowgroveError", "__version__"]
