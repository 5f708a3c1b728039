"""The capacity plan (``tuner capacity``): which GPU types, how many, at which
tensor-parallel size and settings, at what cost, for a peak at the SLO.

Options screened on the twin (``option``), what ``--from`` runs teach it
(``calibration``), the fleet's arithmetic (``fleet``), the plan and its configs
(``plan``), its terminal text (``text``). Imports ``tuner.search`` and below; the
command (``tuner.cli.capacity``) wires the report in.
"""
