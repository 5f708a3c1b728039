"""What the tuner knows about vLLM, pure: no processes, no sockets, no threads.

Models and GPUs (``models``, ``gpus``), vLLM's releases (``versions``), the memory model
that predicts what a launch will do (``memory``), vLLM's own startup and error messages
(``messages``), reading its startup log (``log``), failure kinds and their
classification from a log (``failures``, ``classify``), the out-of-memory edge at
startup (``startup_edge``), the memory model's accuracy against real logs
(``accuracy``), the memory model's start boundary a run records for its report
(``memory_boundary``), the search space over vLLM's settings (``space``), which of them
change the model's numerics (``numerics``), vLLM's flags (``flags``) and its platform
quirks (``platform``).

May import ``tuner.errors`` and each other; never ``tuner.serving``, ``tuner.search``,
``tuner.cli``, ``tuner.sim`` or ``reports``.
"""
