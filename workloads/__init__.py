"""Workloads: production-shaped load for vLLM endpoints."""
