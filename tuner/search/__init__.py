"""The tuning job: from a configuration to a recommendation.

The configuration and the resolved context (``config``, ``context``), the search space
and its sampler (``space``, ``sampling``, ``distinct_sampler``), the Optuna study and its
workers (``study``; Optuna's API behind ``optuna_store`` alone), one trial's evaluation
(``evaluate``) and rate search (``rate_search``, with its per-level evidence in
``level_evidence``), the twin's predictions (``predict``), the out-of-memory edge
(``edge``), the recommendation (``recommend``), the whole job (``tune``) and the
regression gate's comparison (``check``).

May import ``tuner.serving``, ``tuner.vllm``, ``tuner.sim``, ``tuner.deploy``,
``tuner.errors`` and ``workloads``; never ``tuner.cli`` or ``reports`` (the command
passes the report writer in).
"""
