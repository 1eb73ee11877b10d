"""Check `vllm serve` argument lists with vLLM's own parser; run with the vLLM venv's python (imports take ~10 s,
so every check happens in this one process).

    python vllm_argcheck.py OUT.json < {"argvs": {"dev": [...], ...}}

OUT.json gets, per argv, the parser's error (or null) and the parsed values that matter, plus the names vLLM
registers for tool-call parsers, reasoning parsers and KV cache dtypes: the parser alone does not check those.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import typing
from pathlib import Path
from typing import Any

PARSED_FIELDS = ("model_tag", "host", "port", "max_model_len", "gpu_memory_utilization", "max_num_batched_tokens",
                 "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "language_model_only",
                 "limit_mm_per_prompt", "kv_cache_dtype", "dtype", "enforce_eager", "tensor_parallel_size",
                 "disable_chunked_mm_input", "num_gpu_blocks_override")


def check_argv(argv: list[str]) -> dict[str, Any]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            namespace = parser.parse_args(argv)
        validate_parsed_serve_args(namespace)
    except SystemExit:
        return {"error": errors.getvalue().strip().splitlines()[-1], "parsed": None}
    except (TypeError, ValueError) as err:
        return {"error": f"{type(err).__name__}: {err}", "parsed": None}
    return {"error": None, "parsed": {name: getattr(namespace, name, None) for name in PARSED_FIELDS}}


def registries() -> dict[str, list[str]]:
    from vllm.config.cache import CacheDType
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return {"tool_call_parsers": ToolParserManager.list_registered(),
            "reasoning_parsers": ReasoningParserManager.list_registered(),
            "cache_dtypes": list(typing.get_args(CacheDType))}


def main(out_path: Path) -> None:
    argvs: dict[str, list[str]] = json.load(sys.stdin)["argvs"]
    result = {"configs": {name: check_argv(argv) for name, argv in argvs.items()}, **registries()}
    out_path.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
