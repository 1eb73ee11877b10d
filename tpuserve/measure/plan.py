"""`tpuserve plan`: how much KV cache fits in HBM, and how many full-length conversations that is, before deploying.

KV layers and sizes follow the model's HF config the way vLLM (`--backend gpu`) and tpu-inference (`tpu`, the
default) build their caches; the sources and the arithmetic are in docs/design/planner.md. Activations and
compilation scratch come out of the budget too on a real server: treat the counts as upper bounds.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from tpuserve.cli import echo_json, json_option
from tpuserve.facts import (HYPERDISK_BALANCED_FREE_MIBPS, HYPERDISK_PRICES_AS_OF, V6E_HBM_GIB,
                            hyperdisk_balanced_monthly_usd)
from tpuserve.measure.cost import cache_disk_options
from tpuserve.serving import (DEFAULT_MODEL, GIB, ConfigError, ServingConfig, fewest_chips, model_presets,
                              preset_weights_gib, tensor_parallel_choices)

TPU, GPU = "tpu", "gpu"
BACKENDS = (TPU, GPU)
# Bytes per K or V element of each `--kv-cache-dtype`; "auto" is the model's (docs/design/planner.md has sources).
KV_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
AUTO = "auto"
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2}  # vLLM serves a float32 checkpoint in 16 bits
TPU_WORD_BYTES = 4  # the kernel packs K/V values into 32-bit words
TPU_LANES = 128
V6E_CHIPS = (1, 4, 8)  # ct6e-standard-1t, -4t, -8t
GPU_BLOCK_SIZE = 16
VLLM_DEFAULT_MAX_NUM_SEQS = 256  # `vllm serve`'s on a device under 70 GiB
# tpu-inference's page size bounds, and the SMEM (1 MB up to v6e) its block tables must fit in half of.
TPU_PAGE_MIN, TPU_PAGE_MAX, TPU_PAGE_SPLIT, TPU_PAGE_LONG_CONTEXT = 16, 256, 16, 8192
TPU_SMEM_BYTES = 1024 * 1024
FULL, SLIDING = "full_attention", "sliding_attention"
SERVED = ServingConfig()


def align(value: int, to: int) -> int:
    return math.ceil(value / to) * to


def next_power_of_2(value: int) -> int:
    return 1 << (value - 1).bit_length()


def default_max_num_seqs(max_num_batched_tokens: int) -> int:
    return min(VLLM_DEFAULT_MAX_NUM_SEQS, max_num_batched_tokens)


def tpu_block_size(max_model_len: int, max_num_seqs: int) -> int:
    """tpu-inference's KV block size without --block-size (docs/design/planner.md#where-the-defaults-come-from)."""
    page = TPU_PAGE_MIN if max_model_len > TPU_PAGE_LONG_CONTEXT else min(
        max(next_power_of_2(max_model_len) // TPU_PAGE_SPLIT, TPU_PAGE_MIN), TPU_PAGE_MAX)
    pages_per_request = TPU_SMEM_BYTES // 2 // max_num_seqs // 4
    return max(page, next_power_of_2(math.ceil(max_model_len / pages_per_request)))


def block_size_for(backend: str, max_model_len: int, max_num_seqs: int) -> int:
    """The block size the backend picks by itself (no --block-size)."""
    return tpu_block_size(max_model_len, max_num_seqs) if backend == TPU else GPU_BLOCK_SIZE


def padded_kv_heads(kv_heads: int, chips: int) -> int:
    """KV heads per chip after tpu-inference pads them to a multiple of the chips (`get_padded_num_heads`)."""
    if kv_heads >= chips and kv_heads % chips == 0:
        return kv_heads // chips
    if kv_heads < chips and chips % kv_heads == 0:
        return 1  # replicated: every chip holds one
    raise ConfigError("--chips", f"{kv_heads} KV heads cannot be split over {chips} chips")


@dataclass(frozen=True)
class KvLayer:
    """One decoder layer that stores its own K and V."""

    index: int
    kind: str
    kv_heads: int
    head_dim: int
    window: int | None

    def bytes_per_token(self, dtype_bytes: int, backend: str, chips: int) -> int:
        """K and V of one token in this layer on one chip (or GPU)."""
        if backend == GPU:
            return 2 * max(1, self.kv_heads // chips) * self.head_dim * dtype_bytes
        heads = padded_kv_heads(self.kv_heads, chips)
        packing = TPU_WORD_BYTES // dtype_bytes
        if self.head_dim == 64:  # kernel_hd64: K and V side by side in 128 lanes
            return align(heads, packing) * TPU_LANES * dtype_bytes
        return align(2 * heads, packing) * align(self.head_dim, TPU_LANES) * dtype_bytes

    def tokens_held(self, max_model_len: int, block_size: int, max_num_batched_tokens: int,
                    windowed: bool = True) -> int:
        """Most tokens one request keeps in this layer, in whole blocks."""
        if self.window is None or not windowed:
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
    hbm_gib: float  # per chip
    utilization: float
    weights_gib: float  # the whole model
    kv_dtype: str  # a KV_DTYPE_BYTES name, or "auto"
    max_model_len: int
    block_size: int
    max_num_batched_tokens: int
    backend: str = TPU
    chips: int = 1
    max_num_seqs: int = VLLM_DEFAULT_MAX_NUM_SEQS  # what the TPU block size follows (tpu_block_size)

    @property
    def usable_gib(self) -> float:
        return self.hbm_gib * self.utilization

    @property
    def weights_per_chip_gib(self) -> float:
        return self.weights_gib / self.chips

    @property
    def kv_bytes(self) -> int:
        """What vLLM may use for KV on each chip: its share of HBM minus the chip's part of the weights, or 0."""
        return max(int((self.usable_gib - self.weights_per_chip_gib) * GIB), 0)


@dataclass(frozen=True)
class Plan:
    num_layers: int
    layers: list[KvLayer]
    budget: Budget
    kv_dtype: str  # what `auto` resolved to, e.g. "bfloat16"
    kv_bytes_per_token: int  # per chip
    blocks: int
    resident_tokens: int
    context_bytes: int  # one max_model_len request, per chip
    contexts: int
    contexts_if_windows_kept_all: int  # every KV layer keeps every token (what tpu-inference does)
    contexts_if_windows_honoured: int  # sliding layers keep only their window (what vLLM on GPU does)
    fp8_saves: bool  # whether an fp8 KV cache would take fewer bytes per token than a 16-bit one


def resolve_kv_dtype(kv_dtype: str, config: Mapping[str, Any]) -> tuple[str, int]:
    """(name, bytes per element); "auto" is the model's dtype as its config states it (bfloat16 when silent)."""
    if kv_dtype != AUTO:
        return "bfloat16" if kv_dtype == "bf16" else kv_dtype, KV_DTYPE_BYTES[kv_dtype]
    text = text_config(config)
    model_dtype = next((c[key] for c in (text, config) for key in ("dtype", "torch_dtype") if c.get(key)), "bfloat16")
    return str(model_dtype), MODEL_DTYPE_BYTES.get(str(model_dtype), 2)


def per_token(layers: list[KvLayer], dtype_bytes: int, budget: Budget) -> int:
    return sum(layer.bytes_per_token(dtype_bytes, budget.backend, budget.chips) for layer in layers)


def context_bytes(layers: list[KvLayer], dtype_bytes: int, budget: Budget, windowed: bool) -> int:
    return sum(layer.bytes_per_token(dtype_bytes, budget.backend, budget.chips) * layer.tokens_held(
        budget.max_model_len, budget.block_size, budget.max_num_batched_tokens, windowed) for layer in layers)


def make_plan(config: Mapping[str, Any], budget: Budget) -> Plan:
    if budget.backend not in BACKENDS:
        raise ConfigError("--backend", f"{budget.backend!r} is not one of {', '.join(BACKENDS)}")
    layers = kv_layers(config)
    dtype, dtype_bytes = resolve_kv_dtype(budget.kv_dtype, config)
    token_bytes = per_token(layers, dtype_bytes, budget)
    # vLLM sizes the cache in blocks: available bytes // (block_size × bytes per token of every layer).
    blocks = budget.kv_bytes // (budget.block_size * token_bytes)
    windowed = context_bytes(layers, dtype_bytes, budget, windowed=True)
    every_token = context_bytes(layers, dtype_bytes, budget, windowed=False)
    context = every_token if budget.backend == TPU else windowed
    return Plan(required_int(text_config(config), "num_hidden_layers"), layers, budget, dtype, token_bytes, blocks,
                blocks * budget.block_size, context, budget.kv_bytes // context, budget.kv_bytes // every_token,
                budget.kv_bytes // windowed, per_token(layers, 1, budget) < per_token(layers, 2, budget))


@dataclass(frozen=True)
class Model:
    """What the plan is for: its config, weights size, the name it is shown under and where both came from."""

    name: str
    config: Mapping[str, Any]
    weights_gib: float  # the checkpoint (what a boot reads from disk)
    source: str
    measured: tuple[Mapping[str, Any], ...] = ()  # a preset's recorded allocator figures
    hbm_gib: float | None = None  # what the loaded model takes in HBM, when measured; else weights_gib


def resolve_model(model: str | None, config_path: Path | None, weights_gib: float | None) -> Model:
    """--config/--weights-gib, then the checkpoint beside the config, then --model's preset; without --model a
    --config stands alone (named by itself, borrowing no preset's weights)."""
    given_weights = weights_gib
    preset = model_presets().get(model or DEFAULT_MODEL) if config_path is None or model else None
    if config_path is None and preset is None:
        raise ConfigError("--config", f"no built-in preset for {model!r} (have: {', '.join(model_presets())}); "
                          "pass its HF config.json")
    try:  # a file that is no config is a bad option (exit 2), as every other bad file is
        config = json.loads(config_path.read_text()) if config_path else preset["config"]
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"{config_path}: not valid JSON ({error})", param_hint="--config") from error
    if not isinstance(config, Mapping):
        raise click.BadParameter(f"{config_path}: not a JSON object", param_hint="--config")
    # a config's own model name (`_name_or_path`, which transformers writes), else the file's path
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    name = model or (str(config.get("_name_or_path") or text.get("_name_or_path") or config_path) if config_path
                     else DEFAULT_MODEL)
    source = str(config_path) if config_path else f"built-in preset ({preset['config_source']})"
    if weights_gib is None and config_path and (files := list(config_path.parent.glob("*.safetensors"))):
        weights_gib = sum(path.stat().st_size for path in files) / GIB  # the checkpoint beside the config
        source += f"; weights from {config_path.parent}/*.safetensors"
    if weights_gib is None and preset:
        weights_gib = preset_weights_gib(preset)
        source += f"; weights: {preset['weights_source']}"
    if weights_gib is None:
        raise ConfigError("--weights-gib", f"unknown for {name}: no safetensors beside {config_path}; give "
                          "--weights-gib (or --model naming a built-in preset)")
    own = preset and config_path is None
    hbm = preset.get("hbm_gib") if own and given_weights is None else None
    if hbm is not None:
        source += f"; in HBM after loading: {hbm} GiB ({preset['hbm_source']})"
    return Model(name, config, weights_gib, source, tuple(preset.get("measured", ())) if own else (), hbm)


def measurement_for(model: Model, plan: Plan) -> Mapping[str, Any] | None:
    """The preset's recorded allocation taken under this plan's conditions, if any."""
    budget = plan.budget
    here = (budget.backend, budget.chips, budget.utilization, budget.block_size, budget.max_model_len, plan.kv_dtype,
            budget.hbm_gib)
    return next((m for m in model.measured if here == (TPU, m["chips"], m["utilization"], m["block_size"],
                                                       m["max_model_len"], m["kv_dtype"], V6E_HBM_GIB)), None)


# A machine's chips as engines: the stack's tensorParallelSize (tpuserve/serving.py).

@dataclass(frozen=True)
class Engines:
    chips: int  # the machine's
    tensor_parallel_size: int  # each engine's
    auto: bool  # chosen by the stack's rule, not given

    @property
    def count(self) -> int:
        return self.chips // self.tensor_parallel_size


def engines_for(model: Model, chips: int, tensor_parallel_size: int, backend: str, usable_gib: float) -> Engines:
    """How the stack splits `chips`: as given, else (0) the fewest chips that hold the weights; one engine on GPU."""
    if backend != TPU:
        return Engines(chips, chips, False)
    heads = text_config(model.config).get("num_attention_heads")
    if tensor_parallel_size:
        if chips % tensor_parallel_size:
            choices = ", ".join(map(str, tensor_parallel_choices(chips, heads)))
            raise ConfigError("--tensor-parallel-size", f"{tensor_parallel_size} does not split {chips} chip(s) into "
                              f"whole engines; use one of {choices}")
        return Engines(chips, tensor_parallel_size, False)
    return Engines(chips, fewest_chips(model.weights_gib, heads, chips, usable_gib), True)


def engine_lines(plan: Plan, engines: Engines) -> list[tuple[str, str]]:
    if engines.count == 1:
        return []
    tp = engines.tensor_parallel_size
    how = ", auto: the fewest chips that hold the weights" if engines.auto else ""
    return [("Engines", f"{engines.count} × {tp} chip{'s' if tp > 1 else ''} on {engines.chips} chips "
                        f"(tensorParallelSize {tp}{how}): the counts above are one engine's; the machine holds "
                        f"{engines.count * plan.resident_tokens:,} resident KV tokens and "
                        f"{engines.count * plan.contexts:,} full-length contexts")]


# The cache disk: what its throughput buys a warm boot, and what it costs.
WARM_BOOT_TARGET_S = 180
# A warm boot's steps besides reading the weights: estimates (docs/design/planner.md#the-warm-boot-estimate).
WARM_BOOT_OTHER_S = (
    ("guest OS boot, startup script, supervisor start (Docker installed)", 45),
    ("container start and vLLM + tpu-inference imports", 25),
    ("XLA precompile with every program cached (tracing and lowering still run; benchmarks/compile_cache.py "
     "measures the CPU analogue)", 60),
    ("readiness and refused-modality checks", 10),
)


@dataclass(frozen=True)
class DiskPlan:
    size_gb: int
    throughput_mibps: int
    iops: int
    weights_gib: float

    def weights_s(self, throughput_mibps: int | None = None) -> float:
        return self.weights_gib * 1024 / (throughput_mibps or self.throughput_mibps)

    @property
    def warm_boot_s(self) -> float:
        return sum(seconds for _, seconds in WARM_BOOT_OTHER_S) + self.weights_s()

    def monthly_usd(self) -> dict[str, float]:
        """Per month while the disk exists: capacity, throughput above the free 140 MiB/s, IOPS above 3,000."""
        capacity = hyperdisk_balanced_monthly_usd(self.size_gb)
        throughput = hyperdisk_balanced_monthly_usd(0, throughput_mibps=self.throughput_mibps)
        iops = hyperdisk_balanced_monthly_usd(0, iops=self.iops)
        return {"capacity": round(capacity, 2), "throughput": round(throughput, 2), "iops": round(iops, 2),
                "total": round(capacity + throughput + iops, 2)}


def disk_lines(disk: DiskPlan) -> list[tuple[str, str]]:
    free = disk.weights_s(HYPERDISK_BALANCED_FREE_MIBPS)
    cost = disk.monthly_usd()
    verdict = "within" if disk.warm_boot_s <= WARM_BOOT_TARGET_S else "over"
    return [
        ("Cache disk reads", f"{disk.throughput_mibps} MiB/s: the weights ({disk.weights_gib:.2f} GiB) in "
                             f"{disk.weights_s():.0f} s (at the free {HYPERDISK_BALANCED_FREE_MIBPS} MiB/s: {free:.0f} s)"),
        ("Warm boot, estimated", f"{disk.warm_boot_s:.0f} s, {verdict} the {WARM_BOOT_TARGET_S} s target: the weights' "
                                 f"{disk.weights_s():.0f} s and {sum(s for _, s in WARM_BOOT_OTHER_S)} s estimated for "
                                 "boot, imports, the cached XLA precompile and the checks"),
        ("Cache disk cost", f"${cost['total']:.2f} / month while it exists: {disk.size_gb} GB ${cost['capacity']:.2f} "
                            f"+ throughput ${cost['throughput']:.2f} + IOPS ${cost['iops']:.2f} (Google's list prices "
                            f"of {HYPERDISK_PRICES_AS_OF}, tpuserve/facts.py)"),
    ]


# docs/design/planner.md#the-fp8_e5m2-line-in-a-v6e-boot-log
FP8_LOG_NOTE = ("v6e servers log \"Automatically using fp8_e5m2 for FP8 KV cache on TPU v6e.\" at boot whatever "
                "--kv-cache-dtype is: it says which fp8 type would be used, not that the cache is fp8. With auto the "
                "pool is 16-bit (public v6e-1 logs: regular_attn_dtype=bfloat16, a pool the bf16 size to 0.01%)")


def shows_fp8_note(plan: Plan) -> bool:
    return plan.budget.backend == TPU and KV_DTYPE_BYTES.get(plan.kv_dtype, 2) == 2


def dtype_note(plan: Plan) -> str:
    budget = plan.budget
    name = f"{plan.kv_dtype} = auto, the model's dtype" if budget.kv_dtype == AUTO else plan.kv_dtype
    if KV_DTYPE_BYTES.get(budget.kv_dtype) == 1 and not plan.fp8_saves:
        heads = {padded_kv_heads(layer.kv_heads, budget.chips) for layer in plan.layers}
        return (f"{name}: no smaller than bf16 on TPU, whose kernel packs K and V into 32-bit words: with "
                f"{'/'.join(map(str, sorted(heads)))} KV head(s) per chip an fp8 word stays half empty")
    return f"{name}, every KV layer"


def block_note(budget: Budget) -> str:
    if budget.block_size != block_size_for(budget.backend, budget.max_model_len, budget.max_num_seqs):
        return "blocks of --block-size"
    if budget.backend == GPU:
        return f"blocks of vLLM's default {GPU_BLOCK_SIZE}"
    return (f"blocks of tpu-inference's page size for max_model_len {budget.max_model_len:,} and max_num_seqs "
            f"{budget.max_num_seqs}")


def plan_lines(plan: Plan, model: Model) -> list[tuple[str, str]]:
    budget = plan.budget
    shared = plan.num_layers - len(plan.layers)
    groups = Counter((layer.kind, layer.kv_heads, layer.head_dim, layer.window) for layer in plan.layers)
    chips = f"{budget.chips} chip{'s' if budget.chips > 1 else ''}"
    if budget.backend == TPU:
        backend = f"TPU (vLLM + tpu-inference), {chips}"
        context = "every KV layer keeps every token on TPU"
        contexts = (f"{plan.contexts:,} ({plan.contexts_if_windows_honoured:,} if sliding layers kept only their "
                    "window, as vLLM does on GPU)")
    else:
        backend = f"GPU (upstream vLLM), {chips}"
        context = "sliding layers keep their window"
        contexts = (f"{plan.contexts:,} ({plan.contexts_if_windows_kept_all:,} if sliding layers kept every token, "
                    "as on TPU)")
    weights = (f"{budget.weights_gib:.2f} GiB weights" if budget.chips == 1
               else f"{budget.weights_gib:.2f} / {budget.chips} GiB weights")
    lines = [
        ("Backend", backend),
        ("KV layers", f"{len(plan.layers)} of {plan.num_layers} ({shared} reuse another layer's KV)"),
        *(("", f"{count} × {kind}: {heads} KV head(s) × {dim}" + (f", window {window}" if window else ""))
          for (kind, heads, dim, window), count in sorted(groups.items(), key=lambda item: item[0][0])),
        ("KV per token" + (" per chip" if budget.chips > 1 else ""),
         f"{plan.kv_bytes_per_token / 1024:g} KiB ({dtype_note(plan)})"),
        ("KV budget" + (" per chip" if budget.chips > 1 else ""),
         f"{budget.hbm_gib:g} GiB × {budget.utilization:g} − {weights} = {budget.kv_bytes / GIB:.2f} GiB"),
        ("Resident KV tokens", f"{plan.resident_tokens:,} ({plan.blocks:,} blocks of {budget.block_size})"),
        ("", block_note(budget)),
        (f"One {budget.max_model_len:,}-token context", f"{plan.context_bytes / 2**20:,.1f} MiB ({context})"),
        ("Full-length contexts that fit", contexts),
    ]
    measured = measurement_for(model, plan)
    if measured:
        lines.append(("Measured", f"{measured['blocks']:,} blocks of {measured['block_size']} (this plan "
                                  f"{plan.blocks / measured['blocks'] - 1:+.1%}): {measured['source']}"))
    if shows_fp8_note(plan):
        lines.append(("\"fp8_e5m2\" in the log", FP8_LOG_NOTE))
    return lines


def advice(plan: Plan, max_model_len: int) -> str | None:
    """A warning when not one full-length context fits, naming only the changes that would help."""
    budget = plan.budget
    if plan.contexts >= 1:
        return None
    if budget.weights_per_chip_gib >= budget.usable_gib:
        if budget.backend == TPU:
            enough = next((chips for chips in V6E_CHIPS if chips > budget.chips
                           and budget.weights_gib / chips < budget.usable_gib), None)
            shard = (f"shard them over {enough} chips (--chips {enough}: ct6e-standard-{enough}t)" if enough else
                     f"(not even {V6E_CHIPS[-1]} v6e chips hold them)")
        else:
            shard = "shard them over more GPUs (--chips)"
        return (f"warning: the weights alone ({budget.weights_per_chip_gib:.2f} GiB per chip) do not fit in the "
                f"{budget.usable_gib:.2f} GiB vLLM may use ({budget.hbm_gib:g} GiB × {budget.utilization:g}): "
                f"{shard}, or serve a smaller or quantized checkpoint; a shorter context or a smaller KV dtype "
                "cannot help")
    fixes = [f"lower --max-model-len (at most {plan.resident_tokens:,} tokens fit)" if plan.resident_tokens
             else None,
             "use --kv-dtype fp8" if plan.fp8_saves and KV_DTYPE_BYTES.get(budget.kv_dtype, 2) == 2 else None,
             "raise --utilization" if budget.utilization < 0.95 else None,
             "shard over more chips (--chips)"]
    return (f"warning: not even one {max_model_len:,}-token context fits ({plan.context_bytes / GIB:.2f} GiB "
            f"needed, {budget.kv_bytes / GIB:.2f} GiB available): " + ", or ".join(f for f in fixes if f))


@click.command()
@click.option("--model", help=f"Model id of a built-in preset; default {DEFAULT_MODEL}, or --config's name.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The model's HF config.json (text config nested or flat) instead of the preset.")
@click.option("--backend", type=click.Choice(BACKENDS), default=TPU, show_default=True,
              help="tpu: what tpu-inference allocates (every KV layer keeps every token; fp8 packed in 32-bit "
              "words); gpu: upstream vLLM's arithmetic (sliding windows honoured).")
@click.option("--chips", type=click.IntRange(min=1), default=1, show_default=True,
              help="Chips of the machine: 4 for ct6e-standard-4t (GPUs with --backend gpu, one engine over all). On "
              "TPU they serve chips / --tensor-parallel-size engines; the counts are per engine and per chip.")
@click.option("--tensor-parallel-size", type=click.IntRange(min=0), default=0, show_default=True,
              help="Chips per engine, as the stack's tensorParallelSize: weights are split over them; 0 = the fewest "
              "that hold the weights (the stack's auto).")
@click.option("--hbm-gib", type=click.FloatRange(min=0, min_open=True), default=V6E_HBM_GIB, show_default=True,
              help="Usable HBM per chip (default: v6e).")
@click.option("--utilization", type=click.FloatRange(min=0, max=1, min_open=True),
              default=SERVED.gpu_memory_utilization, show_default=True,
              help="vLLM --gpu-memory-utilization (default: the stack's).")
@click.option("--weights-gib", type=click.FloatRange(min=0), help="Weights size (default: the checkpoint's "
              "safetensors beside --config, else the preset's).")
@click.option("--kv-dtype", type=click.Choice([AUTO, *KV_DTYPE_BYTES]), default=SERVED.kv_cache_dtype,
              show_default=True, help="vLLM --kv-cache-dtype (default: the stack's; auto = the model's dtype).")
@click.option("--max-model-len", type=click.IntRange(min=1), default=SERVED.max_model_len, show_default=True,
              help="vLLM --max-model-len (default: the stack's).")
@click.option("--max-num-seqs", type=click.IntRange(1, TPU_SMEM_BYTES // 8),
              help=f"vLLM --max-num-seqs (default: vLLM's, {VLLM_DEFAULT_MAX_NUM_SEQS} or --max-num-batched-tokens if "
              "fewer): with --max-model-len it sets tpu-inference's block size.")
@click.option("--block-size", type=click.IntRange(min=1), help="vLLM --block-size (default: what the backend picks: "
              "on TPU from --max-model-len and --max-num-seqs, as tpu-inference does; 16 with --backend gpu).")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=SERVED.max_num_batched_tokens,
              show_default=True, help="vLLM --max-num-batched-tokens: how far past its window a sliding layer holds "
              "KV with --backend gpu (default: the stack's).")
@cache_disk_options
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="--json is the same as --format json.")
@json_option
def plan(model: str | None, config_path: Path | None, backend: str, chips: int, tensor_parallel_size: int,
         hbm_gib: float, utilization: float, weights_gib: float | None, kv_dtype: str, max_model_len: int,
         max_num_seqs: int | None, block_size: int | None, max_num_batched_tokens: int, cache_disk_gb: int,
         cache_disk_mibps: int, cache_disk_iops: int, output_format: str, as_json: bool) -> None:
    """KV bytes per token, resident KV tokens and how many full-length contexts fit in HBM, per engine and for the
    machine's engines; what the cache disk's throughput buys a warm boot, and what it costs."""
    try:
        resolved = resolve_model(model, config_path, weights_gib)
        engines = engines_for(resolved, chips, tensor_parallel_size, backend, hbm_gib * utilization)
        seqs = max_num_seqs or default_max_num_seqs(max_num_batched_tokens)
        block = block_size or block_size_for(backend, max_model_len, seqs)
        result = make_plan(resolved.config, Budget(hbm_gib, utilization, resolved.hbm_gib or resolved.weights_gib, kv_dtype,
                                                   max_model_len, block, max_num_batched_tokens, backend,
                                                   engines.tensor_parallel_size, seqs))
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    disk = DiskPlan(cache_disk_gb, cache_disk_mibps, cache_disk_iops, resolved.weights_gib) if cache_disk_gb else None
    if as_json or output_format == "json":
        fields = asdict(result)
        echo_json({"model": resolved.name, "source": resolved.source, "backend": backend, "chips": result.budget.chips,
                   "kv_layers": fields.pop("layers"), **fields, "kv_budget_bytes": result.budget.kv_bytes,
                   "measured_blocks": (measurement_for(resolved, result) or {}).get("blocks"),
                   "block_size_note": block_note(result.budget),
                   "fp8_log_note": FP8_LOG_NOTE if shows_fp8_note(result) else None, "machine_chips": chips,
                   "tensor_parallel_size": engines.tensor_parallel_size, "engines": engines.count,
                   "machine_resident_tokens": engines.count * result.resident_tokens,
                   "machine_contexts": engines.count * result.contexts, "cache_disk": None if disk is None else {
                       **asdict(disk), "weights_read_s": round(disk.weights_s(), 1),
                       "weights_read_s_at_free_throughput": round(disk.weights_s(HYPERDISK_BALANCED_FREE_MIBPS), 1),
                       "warm_boot_estimate_s": round(disk.warm_boot_s), "warm_boot_target_s": WARM_BOOT_TARGET_S,
                       "usd_per_month": disk.monthly_usd(), "prices_as_of": HYPERDISK_PRICES_AS_OF}})
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=resolved.name, caption=resolved.source, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        rows = plan_lines(result, resolved) + engine_lines(result, engines) + (disk_lines(disk) if disk else [])
        for label, value in rows:
            table.add_row(label, value)
        Console().print(table)
    if warning := advice(result, max_model_len):
        click.echo(warning, err=True)
