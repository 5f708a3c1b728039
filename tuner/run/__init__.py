"""A run on disk: every file's name, its typed model, one reader.

``layout`` names every file and folder of a run directory (pure); ``files`` is the one
place a run's JSON file is opened and parsed (neither imports the tuning loop, which
writes and resumes through them).

The typed models of a run's files, one module per file kind, which the tuning loop
(``tuner.search``) and the twin (``tuner.twin``) write and every reader reads back:

* ``config``: ``TuneConfig``, every setting of a run (``tune.json``'s ``config``), and
  its ``Objective``;
* ``evaluation``: ``Evaluation``, one candidate's ``evaluation.json`` (a trial or a
  confirmation run), its ``Verdict`` and measured levels (``LevelRecord``);
* ``goodput``: ``Goodput``, ``GoodputUnit``, ``GoodputBound``, a goodput as every file
  states it;
* ``edge``: ``EdgeResult``, the OOM edge's ``edge/edge.json``, and its probes;
* ``recommendation``: ``Recommendation``, ``recommendation/recommendation.json``, its
  variants, confirmation runs and capacity;
* ``quality``: ``QualityResult``, the quality gate's ``quality/quality.json``, its
  ``QualityOutcome``, figures and thresholds, and ``QualityRejection`` (in the
  recommendation: a setting passed over for its result);
* ``summary``: ``TuneSummary``, ``summary.json``;
* ``budget``: ``BudgetRecord``, the time budget's ``budget.json``, and its launches;
* ``parallelism``: ``ParallelismComparison``, ``parallelism.json``;
* ``twin_record``: ``TwinRecord``, the twin's ``twin.json``, and each fit (``TrialFit``);
* ``prompt_lengths``: ``PromptLengthMix``, a level's ``prompt_lengths.json``.

``records`` (``TuneRecord``, ``tune.json``) and ``levels`` (a level's evidence) read what
a run holds for the report; ``reader.RunReader`` reads a whole run for the report,
``tuner capacity --from`` and the regression gate. Nothing here imports the tuning loop,
the twin, the commands or the reports (``[tool.importlinter]`` in ``pyproject.toml``).
"""
