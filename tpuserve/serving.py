"""What vLLM serves and how: the one place serving options become `vllm serve` arguments, for every target, so
`pulumi preview` shows the flags the server runs with. Why: docs/design/config.md."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from tpuserve.facts import (CACHE_ROOT, CONTAINER_HASH_LABEL, CONTAINER_HF_HOME, CONTAINER_XLA_CACHE, V6E_HBM_GIB,
                            VLLM_TPU_IMAGE, XLA_CACHE_KEY_PLACEHOLDER)
from tpuserve.registry import Reference, RegistryError

DEFAULT_MODEL = "google/gemma-4-E2B-it"
DEFAULT_PORT = 8000
GIB = 2**30
CONTAINER_NAME = "vllm"
TEXT_ONLY = "text-only"
V6E_MACHINE = re.compile(r"ct6e-standard-(\d+)t")  # ct6e-standard-4t: 4 chips
TPU_BACKEND = "tpu"  # vLLM on tpu-inference; "gpu" (target local) and "cpu" (e2e) are upstream vLLM's own


@cache
def tpu_support() -> dict[str, Any]:
    """What the TPU backend serves, read from tpu-inference's and vLLM's source at a recorded commit."""
    return json.loads(resources.files("tpuserve").joinpath("data/tpu-inference-support.json").read_text())


# Every modality Gemma 4 registers: every argv names each, or vLLM would allow 999 of one left out.
MODALITIES = tuple(tpu_support()["modalities"]["known"])
MODEL_IMPLS = tuple(tpu_support()["model_impl"]["choices"])  # tpu-inference's MODEL_IMPL_TYPE
MODEL_IMPL_ENV = tpu_support()["model_impl"]["env"]
AUTO_IMPL = "auto"
# vLLM's --kv-cache-dtype choices, and those tpu-inference's runner can map (the rest crash at boot).
KV_CACHE_DTYPES = tuple(tpu_support()["kv_cache_dtypes"]["vllm_choices"])
TPU_KV_CACHE_DTYPES = tuple(tpu_support()["kv_cache_dtypes"]["tpu"])

# Model ids known not to load on the TPU backend, with the reason users get.
KNOWN_BROKEN_ON_TPU = tuple((re.compile(entry["model_ids"], re.IGNORECASE), entry["reason"])
                            for entry in tpu_support()["known_broken"]["models"])


class ConfigError(ValueError):
    """A bad setting; `key` is the stack config key (or CLI option) to fix."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def setting(key: str, doc: str, default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field that also records its stack config key and description (scripts/config_docs.py)."""
    if isinstance(default, (list, dict, tuple)) and "default_factory" not in kwargs:
        kwargs["default_factory"] = (lambda value=default: type(value)(value))
        default = dataclasses.MISSING
    return field(default=default, metadata={"key": key, "doc": doc}, **kwargs)


@dataclass(frozen=True)
class ServingConfig:
    """Serving: what vLLM serves and how, the same `vllm serve` argv on every target (`tpuserve/serving.py`)."""

    model: str = setting("model", "Hugging Face model id served by vLLM.", DEFAULT_MODEL)
    image: str = setting("containerImage", "vLLM TPU container image; default: the pinned digest in "
                         "tpuserve/facts.py. A tag (image:tag) is pinned to the digest it names by `tpuserve up`.",
                         VLLM_TPU_IMAGE)
    max_model_len: int = setting("maxModelLen", "vLLM --max-model-len: longest prompt + completion in tokens.", 65536)
    gpu_memory_utilization: float = setting(
        "gpuMemoryUtilization", "vLLM --gpu-memory-utilization: share of HBM vLLM may use, in (0, 1].", 0.9)
    max_num_batched_tokens: int = setting(
        "maxNumBatchedTokens", "vLLM --max-num-batched-tokens: tokens per scheduler step.", 4096)
    enable_auto_tool_choice: bool = setting(
        "enableAutoToolChoice", "vLLM --enable-auto-tool-choice (needs toolCallParser).", True)
    tool_call_parser: str = setting("toolCallParser", "vLLM --tool-call-parser; empty for none.", "gemma4")
    reasoning_parser: str = setting("reasoningParser", "vLLM --reasoning-parser; empty for none. With a reasoning "
                                    "parser, JSON-schema output is enforced only when enable_thinking is on.", "gemma4")
    mm_limits: Mapping[str, int] | None = setting(
        "multimodalLimits", f"'{TEXT_ONLY}', or a JSON object of per-prompt item limits for vLLM "
        "--limit-mm-per-prompt, e.g. {\"image\":4}; a modality left out is 0. On TPU, audio and video need "
        "modelImpl vllm (Gemma 4's JAX model serves images only).", None)
    kv_cache_dtype: str = setting("kvCacheDtype", "vLLM --kv-cache-dtype; auto = the model's dtype (bf16 for Gemma "
                                  "4), on TPU as elsewhere. On TPU only auto, bfloat16, float16, fp8, fp8_e4m3 and "
                                  "fp8_e5m2 (what tpu-inference's runner can map).", "auto")
    model_impl: str = setting(
        "modelImpl", "TPU only: tpu-inference's model implementation (MODEL_IMPL_TYPE): auto (Gemma 4: its JAX "
        "model, images only), flax_nnx (the same, by name) or vllm (vLLM's PyTorch model through torchax: also "
        "audio and video, which tpu-inference does not test).", AUTO_IMPL)
    extra_args: tuple[str, ...] = setting(
        "extraArgs", "Further `vllm serve` arguments; may not repeat an option that has its own key.", ())
    allow_known_broken_model: bool = setting(
        "allowKnownBrokenModel", "Deploy a model/backend pair known not to load (e.g. Gemma 4 E2B QAT on TPU).",
        False)
    tensor_parallel_size: int = setting(
        "tensorParallelSize", "Chips per vLLM engine (--tensor-parallel-size); the VM runs chips / tensorParallelSize "
        "engines behind one port. 0 = auto: the fewest chips that hold the model's weights (its built-in preset: 1 "
        "for google/gemma-4-E2B-it), every chip for a model without a preset. Target gke: one engine per node (its "
        "chips); target local: localGpus.", 0)
    port: int = DEFAULT_PORT
    host: str = "0.0.0.0"
    backend: str = TPU_BACKEND  # these two follow the stack's target and machine (components/config.py)
    chips: int = 1

    @property
    def tp(self) -> int:
        """Chips per engine: tensorParallelSize, 0 (unresolved) meaning every chip."""
        return self.tensor_parallel_size or self.chips

    @property
    def engines(self) -> int:
        return max(self.chips // self.tp, 1)

    def validate(self, backend: str | None = None) -> ServingConfig:
        """Raise ConfigError naming the offending key; return self so calls chain."""
        backend = backend or self.backend
        if not self.model.strip():
            raise ConfigError("model", "must name a model")
        check_image(self.image)
        if self.max_model_len <= 0:
            raise ConfigError("maxModelLen", f"must be a positive integer, got {self.max_model_len}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("gpuMemoryUtilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_batched_tokens <= 0:
            raise ConfigError("maxNumBatchedTokens", f"must be a positive integer, got {self.max_num_batched_tokens}")
        check_tensor_parallel_size(self)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError("kvCacheDtype", f"{self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        if backend == TPU_BACKEND and self.kv_cache_dtype not in TPU_KV_CACHE_DTYPES:
            raise ConfigError("kvCacheDtype", f"{self.kv_cache_dtype!r} crashes the TPU backend at boot: "
                              "tpu-inference's runner maps the name with jnp.dtype(), which knows only "
                              f"{', '.join(TPU_KV_CACHE_DTYPES)} (tpuserve/data/tpu-inference-support.json); use one "
                              "of those")
        if self.model_impl not in MODEL_IMPLS:
            raise ConfigError("modelImpl", f"{self.model_impl!r} is not one of {', '.join(MODEL_IMPLS)}")
        if backend != TPU_BACKEND and self.model_impl != AUTO_IMPL:
            raise ConfigError("modelImpl", f"{self.model_impl!r} chooses a tpu-inference model implementation; this "
                              "target runs upstream vLLM: leave it auto")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ConfigError("enableAutoToolChoice", "--enable-auto-tool-choice needs toolCallParser to be set")
        if self.mm_limits is not None:
            check_mm_limits(self.mm_limits)
        if backend == TPU_BACKEND:
            check_tpu_modalities(self)
        check_extra_args(self.extra_args)
        if backend == TPU_BACKEND and not self.allow_known_broken_model:
            for pattern, reason in KNOWN_BROKEN_ON_TPU:
                if pattern.search(self.model):
                    raise ConfigError("model", f"{self.model!r}: {reason}. Set allowKnownBrokenModel to deploy "
                                      "it anyway.")
        return self


def check_image(image: str) -> None:
    """A reference docker can pull by (the OCI grammar, tpuserve/registry.py): refused here, not minutes into a boot."""
    if not image.strip() or any(ch.isspace() for ch in image):
        raise ConfigError("containerImage", f"{image!r} is not an image reference like vllm/vllm-tpu:nightly or "
                          f"{VLLM_TPU_IMAGE}")
    try:
        Reference.parse(image)
    except RegistryError as err:
        raise ConfigError("containerImage", str(err)) from None


def parse_mm_limits(value: Any) -> Mapping[str, int] | None:
    """Read the multimodalLimits setting: 'text-only', a JSON object string, or an object."""
    if value is None or value == TEXT_ONLY:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError("multimodalLimits", f"not '{TEXT_ONLY}' and not valid JSON ({err.msg}): {value!r}")
    return check_mm_limits(value)


def check_mm_limits(value: Any) -> Mapping[str, int]:
    if not isinstance(value, Mapping) or not value:
        raise ConfigError("multimodalLimits", f"must be a non-empty mapping of modality to count, got {value!r}")
    for modality, count in value.items():
        if modality not in MODALITIES:
            raise ConfigError("multimodalLimits", f"{modality!r} is not a modality vLLM takes; use "
                              f"{', '.join(MODALITIES)}")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ConfigError("multimodalLimits", f"limit for {modality!r} must be a non-negative integer, "
                              f"got {count!r}")
    return dict(value)


def mm_limits_of(cfg: ServingConfig) -> dict[str, int]:
    """--limit-mm-per-prompt's value: every modality, in MODALITIES order, 0 where multimodalLimits is silent."""
    given = {} if cfg.mm_limits is None else dict(cfg.mm_limits)
    return {modality: int(given.get(modality, 0)) for modality in MODALITIES}


def tpu_impl(cfg: ServingConfig) -> tuple[dict[str, Any], str] | None:
    """(the model architecture's entry, the implementation tpu-inference runs), or None: unknown, nothing refused."""
    for entry in tpu_support()["architectures"].values():
        if entry["model_ids"] in cfg.model.lower():
            return entry, entry["auto_impl"] if cfg.model_impl == AUTO_IMPL else cfg.model_impl
    return None


def check_tpu_modalities(cfg: ServingConfig) -> None:
    """Refuse a modality the TPU implementation cannot serve: one such request would kill the engine."""
    if (found := tpu_impl(cfg)) is None:
        return
    entry, impl = found
    for modality, count in mm_limits_of(cfg).items():
        verdict = entry.get(impl, {}).get(modality, {})
        if count > 0 and not verdict.get("supported", False):
            alternative = [name for name, modes in entry.items()
                           if isinstance(modes, dict) and modes.get(modality, {}).get("supported")]
            fix = (f"set {modality} to 0" + (f", or modelImpl: {alternative[0]} to serve it through that "
                                              "implementation" if alternative else ""))
            raise ConfigError("multimodalLimits", f"{modality}: {count} cannot be served on TPU with "
                              f"MODEL_IMPL_TYPE={impl} ({verdict.get('evidence', 'no support recorded')}, "
                              f"tpu-inference {tpu_support()['sources']['tpu-inference']['commit'][:7]}); {fix}")


def untested_modalities(cfg: ServingConfig) -> list[str]:
    """Modalities enabled on TPU that the implementation serves in its code but tpu-inference never tests."""
    if cfg.backend != TPU_BACKEND or (found := tpu_impl(cfg)) is None:
        return []
    entry, impl = found
    return [modality for modality, count in mm_limits_of(cfg).items()
            if count > 0 and entry.get(impl, {}).get(modality, {}).get("tested_upstream") is False]


@cache
def model_presets() -> dict[str, Any]:
    """The built-in models: each one's HF config and weights size."""
    return json.loads(resources.files("tpuserve").joinpath("data/model-presets.json").read_text())


def preset_weights_gib(preset: dict[str, Any]) -> float:
    return preset["weights_parameters"] * preset["weights_bytes_per_parameter"] / GIB


def attention_heads(model: str) -> int | None:
    preset = model_presets().get(model)
    if preset is None:
        return None
    config = preset["config"]
    return int(config.get("text_config", config)["num_attention_heads"])


def tpu_chips(machine_type: str) -> int:
    """Chips of a TPU v6e machine type (`.../machineTypes/ct6e-standard-4t` -> 4); 0 for any other type."""
    match = V6E_MACHINE.fullmatch(machine_type.rsplit("/", 1)[-1])
    return int(match[1]) if match else 0


def tensor_parallel_choices(chips: int, heads: int | None) -> list[int]:
    """Sizes that split `chips` into whole engines and the attention heads evenly (vLLM refuses the rest at boot)."""
    return [tp for tp in range(1, chips + 1) if chips % tp == 0 and (heads is None or heads % tp == 0)]


def fewest_chips(weights_gib: float, heads: int | None, chips: int, usable_gib: float) -> int:
    """The smallest tensor parallel size whose share of the weights fits in `usable_gib` per chip, else every chip."""
    fits = [tp for tp in tensor_parallel_choices(chips, heads) if weights_gib / tp < usable_gib]
    return fits[0] if fits else chips


def auto_tensor_parallel_size(model: str, chips: int, gpu_memory_utilization: float) -> int:
    """tensorParallelSize 0 on a TPU VM: the fewest chips that hold the preset's weights, every chip without one."""
    preset = model_presets().get(model)
    if preset is None:
        return chips
    return fewest_chips(preset_weights_gib(preset), attention_heads(model), chips, V6E_HBM_GIB * gpu_memory_utilization)


def check_tensor_parallel_size(cfg: ServingConfig) -> None:
    if cfg.tensor_parallel_size < 0:
        raise ConfigError("tensorParallelSize", f"must be 0 (auto) or a positive integer, got "
                          f"{cfg.tensor_parallel_size}")
    heads = attention_heads(cfg.model)
    choices = ", ".join(map(str, tensor_parallel_choices(cfg.chips, heads)))
    if cfg.chips % cfg.tp:
        raise ConfigError("tensorParallelSize", f"{cfg.tp} does not split the machine's {cfg.chips} chip(s) into "
                          f"whole engines; use one of {choices}")
    if heads is not None and heads % cfg.tp:
        raise ConfigError("tensorParallelSize", f"{cfg.tp} does not divide {cfg.model}'s {heads} attention heads, "
                          "which vLLM refuses at boot (vllm/config/model.py verify_with_parallel_config); use one of "
                          f"{choices}")


ENGINE_PORT_OFFSET = 100  # engine i of several on port + 100 + i, libtpu's on 5000 + i (docs/design/engines.md)
TPU_PROCESS_BASE_PORT = 5000


def engine_container(engines: int, index: int = 0) -> str:
    """Engine `index`'s container among `engines`: `vllm` alone, else vllm-0, vllm-1, ..."""
    return CONTAINER_NAME if engines == 1 else f"{CONTAINER_NAME}-{index}"


def engine_addresses(cfg: ServingConfig) -> list[tuple[str, int]]:
    """(container, port) of each engine: `vllm` on the stack's port alone, else vllm-i on 8100 + i behind the front."""
    if cfg.engines == 1:
        return [(CONTAINER_NAME, cfg.port)]
    return [(engine_container(cfg.engines, i), cfg.port + ENGINE_PORT_OFFSET + i) for i in range(cfg.engines)]


def engine_tpu_env(cfg: ServingConfig, index: int) -> dict[str, str]:
    """The libtpu variables that pin engine `index` to its chips, as tpu-inference's worker sets them per rank."""
    if cfg.engines == 1 or cfg.backend != TPU_BACKEND:
        return {}
    first = index * cfg.tp
    port = TPU_PROCESS_BASE_PORT + index
    return {"TPU_VISIBLE_CHIPS": ",".join(str(chip) for chip in range(first, first + cfg.tp)),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": f"1,{cfg.tp},1", "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": str(port), "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "CLOUD_TPU_TASK_ID": "0"}


def backend_env(cfg: ServingConfig) -> dict[str, str]:
    """Environment the serving container needs beyond the caches: MODEL_IMPL_TYPE when modelImpl chose one."""
    return {MODEL_IMPL_ENV: cfg.model_impl} if cfg.backend == TPU_BACKEND and cfg.model_impl != AUTO_IMPL else {}


SHORT_OPTIONS = {"-tp": "--tensor-parallel-size"}  # vLLM 0.32's single-dash aliases (vllm/engine/arg_utils.py)


def option_name(arg: str) -> str | None:
    """Canonical vLLM option name of an argument ('--max_model_len=5' -> '--max-model-len'); None for a value."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return SHORT_OPTIONS.get(name)
    name = name.replace("_", "-")
    return "--" + name.removeprefix("--no-") if name.startswith("--no-") else name


FIRST_CLASS_OPTIONS = {  # options with a setting of their own, which extraArgs may not repeat
    "--model": "model", "--host": "(fixed)", "--port": "(fixed)", "--max-model-len": "maxModelLen",
    "--gpu-memory-utilization": "gpuMemoryUtilization", "--device-memory-utilization": "gpuMemoryUtilization",
    "--max-num-batched-tokens": "maxNumBatchedTokens", "--enable-auto-tool-choice": "enableAutoToolChoice",
    "--tool-call-parser": "toolCallParser", "--reasoning-parser": "reasoningParser",
    "--limit-mm-per-prompt": "multimodalLimits", "--language-model-only": "multimodalLimits",
    "--kv-cache-dtype": "kvCacheDtype", "--tensor-parallel-size": "tensorParallelSize (gcp, gke) or localGpus (local)",
    "--data-parallel-size": "tensorParallelSize (a VM runs chips / tensorParallelSize engines behind one port)",
}


# An option whose value is a secret (--api-key, --hf-token and later ones) would sit in plain text in extraArgs.
SECRET_OPTION = re.compile(r"^--(?:[a-z0-9-]+-)?(?:token|api-key|key|secret|password|passwd|credentials?)$")
SECRET_PATH = {
    "--hf-token": "the Hugging Face token reaches the container through its environment only: set hfTokenSecretId "
                  "(a Secret Manager secret) or `pulumi config set --secret hfToken`",
}
NO_SECRET_PATH = ("the stack has no secret path for it yet (the endpoint is internal: reach it through IAP, or "
                  "front it with `tpuserve litellm`'s proxy and its master key)")
# Options that would make the server answer to another name than the one every check asks for.
RENAMING_OPTIONS = {
    "--served-model-name": "the boot check, the gate and the toolkit ask for `model` by name; give clients "
                           "other names with `tpuserve litellm --alias`",
}


def check_extra_args(extra_args: tuple[str, ...]) -> None:
    """The one place extraArgs are judged: strings only, no repeat of a keyed option, no secret, no renaming."""
    for arg in extra_args:
        if not isinstance(arg, str):
            raise ConfigError("extraArgs", f"every entry must be a string, got {arg!r}")
        name = option_name(arg)
        if name in FIRST_CLASS_OPTIONS:
            raise ConfigError("extraArgs", f"{arg!r} repeats {name}, which is set by "
                              f"{FIRST_CLASS_OPTIONS[name]}; set it there instead")
        if name and SECRET_OPTION.match(name):
            raise ConfigError("extraArgs", f"{name} takes a secret, which would sit in plain text in the startup "
                              f"script, the instance metadata and the vllmArgs output; "
                              f"{SECRET_PATH.get(name, NO_SECRET_PATH)}")
        if name in RENAMING_OPTIONS:
            raise ConfigError("extraArgs", f"{name} would rename the served model: {RENAMING_OPTIONS[name]}")


def vllm_serve_args(cfg: ServingConfig, engine: int = 0) -> list[str]:
    """The arguments that follow `vllm serve` (model first), in a stable order; engines differ in --port only."""
    # Engines behind the front listen on loopback only: clients reach them through it (components/front.py).
    host = cfg.host if cfg.engines == 1 else "127.0.0.1"
    args = [cfg.model, "--host", host, "--port", str(engine_addresses(cfg)[engine][1]),
            "--max-model-len", str(cfg.max_model_len),
            "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
            "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
            "--tensor-parallel-size", str(cfg.tp)]
    if cfg.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    if cfg.enable_auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    if cfg.tool_call_parser:
        args += ["--tool-call-parser", cfg.tool_call_parser]
    if cfg.reasoning_parser:
        args += ["--reasoning-parser", cfg.reasoning_parser]
    limits = mm_limits_of(cfg)
    args += ["--limit-mm-per-prompt", json.dumps(limits, separators=(",", ":"))]
    if cfg.backend == TPU_BACKEND and any(count > 0 for count in limits.values()):
        # tpu-inference warns of failures without it; upstream vLLM sets it itself where needed (docs/configuration.md)
        args.append("--disable-chunked-mm-input")
    return args + list(cfg.extra_args)


# The caches' environment of every vLLM TPU container (VM and gke), HF_HOME first.
TPU_CACHE_ENV = {"HF_HOME": CONTAINER_HF_HOME, "VLLM_XLA_CACHE_PATH": CONTAINER_XLA_CACHE,
                 "JAX_COMPILATION_CACHE_DIR": CONTAINER_XLA_CACHE, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def tpu_container_run_args(cfg: ServingConfig, config_hash: str, secret_env: Sequence[str] = (),
                           engine: int = 0) -> list[str]:
    """One engine's `docker run` arguments on the VM, secrets by name only (docs/design/supervisor.md#the-container)."""
    caches = env_args(TPU_CACHE_ENV)  # HF_HOME, then the XLA cache's three
    return ["run", "--detach", "--name", engine_container(cfg.engines, engine), "--privileged", "--net=host",
            "-v", "/dev/shm:/dev/shm",
            "-v", f"{CACHE_ROOT}/huggingface:{CONTAINER_HF_HOME}", *caches[:2],
            "-v", f"{CACHE_ROOT}/xla/{XLA_CACHE_KEY_PLACEHOLDER}:{CONTAINER_XLA_CACHE}", *caches[2:],
            "-e", "HF_TOKEN", *(arg for name in secret_env for arg in ("-e", name)),
            *env_args({**backend_env(cfg), **engine_tpu_env(cfg, engine)}),
            "--label", f"{CONTAINER_HASH_LABEL}={config_hash}",
            cfg.image, "vllm", "serve", *vllm_serve_args(cfg, engine)]


def env_args(env: Mapping[str, str]) -> list[str]:
    return [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]


def config_hash(cfg: ServingConfig) -> str:
    """Short digest of what is served; the VM reports it and the readiness gate re-runs when it changes."""
    env = backend_env(cfg)  # only when set, so the hash of a config without it did not change when it came
    engines = {"engines": cfg.engines} if cfg.engines > 1 else {}  # likewise: a lone engine's hash stays as it was
    payload = json.dumps([cfg.image, vllm_serve_args(cfg), *([env] if env else []), *([engines] if engines else [])],
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
