"""The tuning job: from a configuration to a recommendation.

The configuration and the resolved context (``config``, ``context``), the sampler of the
search space (``sampling``, ``distinct_sampler``; the space itself is
``tuner.vllm.space``), the Optuna study and its workers (``study``; Optuna's API behind
``optuna_store`` alone), one trial's evaluation (``evaluate``) and rate search
(``rate_search``, with its per-level evidence in ``level_evidence``), the out-of-memory
edge (``edge``), the quality gate of settings that change numerics (``quality_gate``), the
recommendation (``recommend``) and the whole job (``tune``). The
twin it consults (predictions, landscape, picks, fits) is ``tuner.twin``.

May import ``tuner.twin``, ``tuner.serving``, ``tuner.vllm``, ``tuner.sim``,
``tuner.deploy``, ``tuner.errors`` and ``workloads``; never ``tuner.cli`` or ``reports`` (the command
passes the report writer in).
"""
