"""tpu-serve ops toolkit: readiness gate, benchmarks, cost, planning and probes for a vLLM endpoint."""

__version__ = "0.1.0"
