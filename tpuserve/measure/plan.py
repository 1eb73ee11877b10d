"""`tpuserve plan`: how much KV cache fits in HBM, and how many full-length conversations that is, before deploying.

Which layers hold KV and how big it is follows the model's HF config the way vLLM builds its KV cache:
- layers in the last `num_kv_shared_layers` reuse an earlier layer's KV and hold none (Gemma 3n/4);
- a layer's entry in `per_layer_config` (how transformers 5 saves Gemma 4) overrides `head_dim` and
  `num_key_value_heads`; without one, `full_attention` layers use `global_head_dim` when the config has one,
  and `num_global_key_value_heads` when `attention_k_eq_v` is set (older Gemma 4 configs); others use `head_dim`;
- a sliding layer keeps at most `sliding_window - 1 + max_num_batched_tokens` tokens per request, rounded up to
  blocks plus one (vLLM's `SlidingWindowSpec.max_admission_blocks_per_request`); a full layer keeps every token.
A config without `layer_types` is taken as all full attention, which can only overestimate memory.
The budget is `hbm × utilization − weights`; activations and compilation scratch come out of it too on a real
server, so treat the counts as upper bounds.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import click

from tpuserve.cli import json_option
from tpuserve.facts import V6E_HBM_GIB
from tpuserve.serving import DEFAULT_MODEL, ConfigError, ServingConfig

GIB = 2**30
KV_DTYPE_BYTES = {"bf16": 2, "fp8": 1}
FULL, SLIDING = "full_attention", "sliding_attention"
# The stack's serving defaults: a plan without options describes what a default deployment runs.
SERVED = ServingConfig()


@dataclass(frozen=True)
class KvLayer:
    """One decoder layer that stores its own K and V."""

    index: int
    kind: str
    kv_heads: int
    head_dim: int
    window: int | None

    def bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.kv_heads * self.head_dim * dtype_bytes  # K and V

    def tokens_held(self, max_model_len: int, block_size: int, max_num_batched_tokens: int) -> int:
        """Most tokens one request keeps in this layer, in whole blocks."""
        if self.window is None:
            return math.ceil(max_model_len / block_size) * block_size
        live = min(self.window - 1 + max_num_batched_tokens, max_model_len)
        return (math.ceil(live / block_size) + 1) * block_size


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: nested under `text_config` in multimodal configs, top level otherwise."""
    nested = config.get("text_config")
    text = nested if isinstance(nested, Mapping) else config
    if "num_hidden_layers" not in text:
        raise ConfigError("--config", "no num_hidden_layers at the top level or in text_config")
    return text


def required_int(text: Mapping[str, Any], key: str) -> int:
    value = text.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"--config {key}", f"a positive integer expected, got {value!r}")
    return value


def kv_layers(config: Mapping[str, Any]) -> list[KvLayer]:
    """The layers that hold KV, with the heads, head size and window each one stores."""
    text = text_config(config)
    num_layers = required_int(text, "num_hidden_layers")
    attention_heads = required_int(text, "num_attention_heads")
    kv_heads = text.get("num_key_value_heads") or attention_heads
    head_dim = text.get("head_dim") or required_int(text, "hidden_size") // attention_heads
    full_head_dim = text.get("global_head_dim") or head_dim
    full_kv_heads = (text.get("num_global_key_value_heads") if text.get("attention_k_eq_v") else None) or kv_heads
    layer_types = text.get("layer_types") or [FULL] * num_layers
    if len(layer_types) != num_layers:
        raise ConfigError("--config layer_types", f"{len(layer_types)} entries for {num_layers} layers")
    shared = text.get("num_kv_shared_layers") or 0
    if not 0 <= shared < num_layers:
        raise ConfigError("--config num_kv_shared_layers", f"{shared} is not in [0, {num_layers})")
    overrides = text.get("per_layer_config") or {}
    layers = []
    for index, kind in enumerate(layer_types[: num_layers - shared]):
        if kind not in (FULL, SLIDING):
            raise ConfigError(f"--config layer_types[{index}]", f"{kind!r} is not {FULL} or {SLIDING}")
        full = kind == FULL
        override = overrides.get(str(index)) or overrides.get(index) or {}
        layers.append(KvLayer(
            index, kind,
            kv_heads=override.get("num_key_value_heads") or (full_kv_heads if full else kv_heads),
            head_dim=override.get("head_dim") or (full_head_dim if full else head_dim),
            window=None if full else required_int(text, "sliding_window"),
        ))
    return layers


@dataclass(frozen=True)
class Budget:
    hbm_gib: float
    utilization: float
    weights_gib: float
    kv_dtype: str
    max_model_len: int
    block_size: int
    max_num_batched_tokens: int

    @property
    def kv_bytes(self) -> int:
        """What vLLM may use for KV: its share of HBM minus the weights; never negative."""
        return max(int((self.hbm_gib * self.utilization - self.weights_gib) * GIB), 0)


@dataclass(frozen=True)
class Plan:
    num_layers: int
    layers: list[KvLayer]
    budget: Budget
    kv_bytes_per_token: int
    resident_tokens: int
    blocks: int
    context_bytes: int
    contexts: int
    contexts_if_windows_kept_all: int

    @property
    def fits_one_context(self) -> bool:
        return self.contexts >= 1


def make_plan(config: Mapping[str, Any], budget: Budget) -> Plan:
    layers = kv_layers(config)
    dtype_bytes = KV_DTYPE_BYTES[budget.kv_dtype]
    per_token = sum(layer.bytes_per_token(dtype_bytes) for layer in layers)
    context_bytes = sum(layer.bytes_per_token(dtype_bytes) * layer.tokens_held(
        budget.max_model_len, budget.block_size, budget.max_num_batched_tokens) for layer in layers)
    padded_len = math.ceil(budget.max_model_len / budget.block_size) * budget.block_size
    resident_tokens = budget.kv_bytes // per_token
    return Plan(
        num_layers=required_int(text_config(config), "num_hidden_layers"),
        layers=layers,
        budget=budget,
        kv_bytes_per_token=per_token,
        resident_tokens=resident_tokens,
        blocks=resident_tokens // budget.block_size,
        context_bytes=context_bytes,
        contexts=budget.kv_bytes // context_bytes,
        contexts_if_windows_kept_all=budget.kv_bytes // (padded_len * per_token),
    )


def presets() -> dict[str, Any]:
    return json.loads(resources.files("tpuserve").joinpath("data/model-presets.json").read_text())


def safetensors_gib(directory: Path) -> float | None:
    """Weights size of a local checkpoint, from its safetensors files; None when it has none."""
    files = list(directory.glob("*.safetensors"))
    return sum(path.stat().st_size for path in files) / GIB if files else None


def preset_weights_gib(preset: Mapping[str, Any]) -> float:
    return preset["weights_parameters"] * preset["weights_bytes_per_parameter"] / GIB


def resolve_model(model: str, config_path: Path | None, weights_gib: float | None) -> tuple[dict[str, Any], float, str]:
    """(config, weights GiB, where they came from): --config/--weights-gib first, then the checkpoint, the preset."""
    preset = presets().get(model)
    if config_path is None and preset is None:
        raise ConfigError("--config", f"no built-in preset for {model!r} (have: {', '.join(presets())}); "
                          "pass its HF config.json")
    try:
        config = json.loads(config_path.read_text()) if config_path else preset["config"]
    except json.JSONDecodeError as error:
        raise ConfigError("--config", f"{config_path}: not valid JSON ({error})") from error
    source = str(config_path) if config_path else f"built-in preset ({preset['config_source']})"
    if weights_gib is None and config_path:
        weights_gib = safetensors_gib(config_path.parent)
        source += f"; weights from {config_path.parent}/*.safetensors" if weights_gib is not None else ""
    if weights_gib is None and preset:
        weights_gib = preset_weights_gib(preset)
        source += f"; weights: {preset['weights_source']}"
    if weights_gib is None:
        raise ConfigError("--weights-gib", f"unknown for {model!r}: no safetensors beside {config_path}")
    return config, weights_gib, source


def describe_layers(layers: list[KvLayer]) -> list[str]:
    groups = Counter((layer.kind, layer.kv_heads, layer.head_dim, layer.window) for layer in layers)
    return [f"{count} × {kind}: {heads} KV head(s) × {dim}" + (f", window {window}" if window else "")
            for (kind, heads, dim, window), count in sorted(groups.items(), key=lambda item: item[0][0])]


def plan_as_json(plan: Plan, model: str, source: str) -> dict[str, Any]:
    return {"model": model, "source": source, "num_layers": plan.num_layers, "budget": asdict(plan.budget),
            "kv_budget_bytes": plan.budget.kv_bytes, "kv_layers": [asdict(layer) for layer in plan.layers],
            "kv_bytes_per_token": plan.kv_bytes_per_token, "resident_tokens": plan.resident_tokens,
            "blocks": plan.blocks, "context_bytes": plan.context_bytes, "contexts": plan.contexts,
            "contexts_if_windows_kept_all": plan.contexts_if_windows_kept_all}


def plan_lines(plan: Plan) -> list[tuple[str, str]]:
    budget = plan.budget
    shared = plan.num_layers - len(plan.layers)
    return [
        ("KV layers", f"{len(plan.layers)} of {plan.num_layers} ({shared} reuse another layer's KV)"),
        *(("", line) for line in describe_layers(plan.layers)),
        ("KV per token", f"{plan.kv_bytes_per_token / 1024:g} KiB ({budget.kv_dtype}, every KV layer)"),
        ("KV budget", (f"{budget.hbm_gib:g} GiB × {budget.utilization:g} − {budget.weights_gib:.2f} GiB weights = "
                       f"{budget.kv_bytes / GIB:.2f} GiB")),
        ("Resident KV tokens", f"{plan.resident_tokens:,} ({plan.blocks:,} blocks of {budget.block_size})"),
        (f"One {budget.max_model_len:,}-token context", f"{plan.context_bytes / 2**20:,.1f} MiB"),
        ("Full-length contexts that fit", (f"{plan.contexts:,} ({plan.contexts_if_windows_kept_all:,} if sliding "
                                           "layers kept every token)")),
    ]


@click.command()
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Model id (selects the built-in preset).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The model's HF config.json (text config nested or flat) instead of the preset.")
@click.option("--hbm-gib", type=click.FloatRange(min=0, min_open=True), default=V6E_HBM_GIB, show_default=True,
              help="Usable HBM per chip (default: v6e).")
@click.option("--utilization", type=click.FloatRange(min=0, max=1, min_open=True),
              default=SERVED.gpu_memory_utilization, show_default=True,
              help="vLLM --gpu-memory-utilization (default: the stack's).")
@click.option("--weights-gib", type=click.FloatRange(min=0), help="Weights size (default: the checkpoint's "
              "safetensors beside --config, else the preset's).")
@click.option("--kv-dtype", type=click.Choice(sorted(KV_DTYPE_BYTES)), default="bf16", show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=1), default=SERVED.max_model_len, show_default=True,
              help="vLLM --max-model-len (default: the stack's).")
@click.option("--block-size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=SERVED.max_num_batched_tokens,
              show_default=True, help="vLLM --max-num-batched-tokens: how far past its window a sliding layer holds "
              "KV (default: the stack's).")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="--json is the same as --format json.")
@json_option
def plan(model: str, config_path: Path | None, hbm_gib: float, utilization: float, weights_gib: float | None,
         kv_dtype: str, max_model_len: int, block_size: int, max_num_batched_tokens: int,
         output_format: str, as_json: bool) -> None:
    """KV bytes per token, resident KV tokens and how many full-length contexts fit in HBM."""
    try:
        config, weights, source = resolve_model(model, config_path, weights_gib)
        result = make_plan(config, Budget(hbm_gib, utilization, weights, kv_dtype, max_model_len, block_size,
                                          max_num_batched_tokens))
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    if as_json or output_format == "json":
        click.echo(json.dumps(plan_as_json(result, model, source), indent=2))
    else:
        echo_table(result, model, source)
    if not result.fits_one_context:
        click.echo(f"warning: not even one {max_model_len:,}-token context fits ({result.context_bytes / GIB:.2f} "
                   f"GiB needed, {result.budget.kv_bytes / GIB:.2f} GiB available): lower --max-model-len, use "
                   "--kv-dtype fp8 or raise --utilization", err=True)


def echo_table(result: Plan, model: str, source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=model, caption=source, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in plan_lines(result):
        table.add_row(label, value)
    Console().print(table)
