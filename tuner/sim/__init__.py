"""The simulated vLLM engine: scheduler, KV blocks, step timing, HTTP front end."""
