"""The ``tuner`` command: argument parsing (``main``) and one module per subcommand.

``tune`` (``tuner.cli.tune``), ``bench`` (``bench``: load against any server), ``trial``
and ``report`` (``report``), ``check`` (the regression gate), ``serve`` and ``plan``,
``k8s`` (the tuning Job's manifests), ``load-worker``; ``sim-serve`` and ``simulate``
come from the simulator (``tuner.sim.serve_cli``, ``tuner.sim.simulate_cli``).

This is the composition root: it may import every other package, ``reports`` included
(it hands the report writer to the tuning job). Nothing imports it but the console
script and ``python -m tuner.cli``.
"""
