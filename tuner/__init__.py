"""vLLM capacity tuner: finds the vLLM settings that serve the most traffic within an SLO."""

__version__ = "0.1.0"
