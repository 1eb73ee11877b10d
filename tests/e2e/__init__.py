"""The real-vLLM test tier: a CPU `vllm serve` of a tiny random-weight Gemma 4 on 127.0.0.1 (see conftest.py)."""
