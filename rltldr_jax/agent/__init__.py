"""The agent side of RLTL;DR: collection phases, multi-step episodes, the insight writer and its schedule."""
