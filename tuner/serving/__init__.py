"""What owns a process or a thread, and what a live measurement reads from them.

The server's lifecycle for both backends (``server``), the registry that stops every
child on exit and after a crash (``processes``), the NVML sampler (``gpu_sampler``),
``/metrics`` scraping (``prometheus_scrape``), load runs through the Locust runner (``load``),
the live server of one trial and its levels (``live_server``), and the steady-state tests a
level's window is judged by (``window``: when it opens; ``backlog``: whether a queue
builds), a level's workload and schedule (``level_schedule``) and the rate bracket
(``bracket``), both shared by the live rate search and the twin, and the greedy answers
and token log-probs the quality gate asks a live server for (``token_probe``).

May import ``tuner.vllm``, ``tuner.errors`` and ``workloads``; never ``tuner.search``,
``tuner.cli`` or ``reports``.
"""
