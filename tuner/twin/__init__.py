"""The twin as the search and capacity use it: the simulated engine (``tuner.sim``) run
on the virtual clock to predict what a live level would measure.

Its predictions of one setting at one rate and of its sustained goodput
(``prediction``), the landscape of the whole space screened on it (``landscape``), the
picks the twin-guided search makes from that landscape (``screen``) and the step costs
fitted to the levels a tune measured, with the twin's accuracy on them (``fit``), and
the simulated engine as a tune's server on the virtual clock (``virtual_server``: the
seam the tests of a tune's decisions use, as httpx's MockTransport stands in for a
network).

May import ``tuner.sim``, ``tuner.serving`` (a level's schedule, the steady-state and
backlog tests), ``tuner.vllm``, ``tuner.errors``, ``tuner.run.layout`` and ``workloads``;
never ``tuner.search``, ``tuner.capacity``, ``tuner.cli`` or ``reports``: the search and
capacity import the twin, not the other way round.
"""
