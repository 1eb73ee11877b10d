"""The front of a VM that runs more than one vLLM engine: Debian's HAProxy on the stack's port, least requests in
flight first, each engine's /health checked. The supervisor writes it from the served config; compared with
tests/components/goldens/haproxy.cfg and checked with `haproxy -c`. Why HAProxy: docs/design/engines.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuserve.serving import ServingConfig, engine_addresses

# A streamed completion may run for many minutes; a request must arrive whole within a minute.
STREAM_TIMEOUT = "1h"
# Out after two failed checks 2 s apart, back at the first /health 200; meanwhile a refused connection is retried
# on another engine (only connection failures are, so no request runs twice).
CHECK = "check inter 2s fall 2 rise 1"


def render_haproxy_config(port: int, engines: Sequence[tuple[str, int]], run_as: str | None = "haproxy",
                          host: str = "") -> str:
    """HAProxy on `host`:`port` in front of `engines` ((name, port) on 127.0.0.1), as `run_as` (None: the caller)."""
    servers = "\n".join(f"  server {name} 127.0.0.1:{engine_port} {CHECK}" for name, engine_port in engines)
    tracked = "\n".join(f"  server {name} 127.0.0.1:{engine_port} track engines/{name}"
                         for name, engine_port in engines)
    user = f"  user {run_as}\n  group {run_as}\n" if run_as else ""
    return f"""# Written by the tpu-serve supervisor from the served config (components/front.py); changes are lost.
global
  maxconn 8192
{user}
defaults
  mode http
  maxconn 8192
  timeout connect 5s
  timeout client {STREAM_TIMEOUT}
  timeout server {STREAM_TIMEOUT}
  timeout http-request 60s
  timeout http-keep-alive 60s
  timeout check 5s
  retries 3
  option redispatch 1
  # A token stream is interactive: without it HAProxy waits to send full packets, "typical delays are around 200 ms"
  # (its configuration manual), which the first token paid on the CPU analogue (benchmarks/engine_front.py).
  option http-no-delay

frontend vllm
  bind {host}:{port}
  use_backend metrics if {{ path /metrics }}
  default_backend engines

# Each request to the engine with the fewest in flight: a long completion keeps its engine busy.
backend engines
  balance leastconn
  option httpchk GET /health
  http-check expect status 200
{servers}

# `tpuserve status` reads /metrics through the front: always the first engine that is up, so its rates come from
# one engine's counters. The Ops Agent scrapes every engine on its own port (components/ops_agent.py).
backend metrics
  balance first
{tracked}
"""


def front_config(serving: ServingConfig) -> str:
    """The VM's HAProxy config for `serving`'s engines; empty for a lone engine, which takes the port itself."""
    return "" if serving.engines == 1 else render_haproxy_config(serving.port, engine_addresses(serving))


if __name__ == "__main__":  # the golden file: python -m components.front > tests/components/goldens/haproxy.cfg
    print(front_config(ServingConfig(chips=4, tensor_parallel_size=1)), end="")
