"""Rollout: the interface (``base``), the backends (``hf`` with ``decode``, ``vllm``), which one runs
and building it (``backend``), and the rollout's config (``config``).

Nothing is imported here, so reading the config imports no backend.
"""
