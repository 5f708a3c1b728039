"""A run on disk: every file's name, its typed model, one reader.

``layout`` names every file and folder of a run directory (pure); ``files`` is the one
place a run's JSON file is opened and parsed (neither imports the tuning loop, which
writes and resumes through them); ``records`` and ``levels`` are the typed models and
readers of what a run holds for the report; ``reader.RunReader`` reads a whole run for
the report, ``tuner capacity --from`` and the regression gate.
"""
