"""The rehearsed GPU host: a stand-in NVML (``pynvml_standin``), host descriptions
(``hosts``), a stand-in vLLM and hub, and the helpers that put them in place."""
