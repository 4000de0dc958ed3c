"""tokentrace: where did the time of this LLM request go, and what to fix first."""

__version__ = "0.1.0"
