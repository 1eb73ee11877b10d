"""The one `vllm serve` argv builder and the serving-option checks (pure functions, no server)."""

import dataclasses
import hashlib
import json

import pytest

from tpuserve.facts import VLLM_TPU_IMAGE
from tpuserve.serving import (
    FIRST_CLASS_OPTIONS, KV_CACHE_DTYPES, MODALITIES, TPU_KV_CACHE_DTYPES, ConfigError, ServingConfig,
    auto_tensor_parallel_size, backend_env, check_extra_args, config_hash, engine_addresses, engine_tpu_env,
    option_name, parse_mm_limits, setting, tpu_container_run_args, tpu_support, untested_modalities, vllm_serve_args,
)


def test_default_args_are_the_reference_deployment_flags():
    assert vllm_serve_args(ServingConfig()) == [
        "google/gemma-4-E2B-it", "--host", "0.0.0.0", "--port", "8000",
        "--max-model-len", "65536", "--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "4096",
        "--tensor-parallel-size", "1",
        "--enable-auto-tool-choice", "--tool-call-parser", "gemma4", "--reasoning-parser", "gemma4",
        # Text-only as tpu-inference recognises it: every limit 0 (not --language-model-only, which leaves the
        # limit dict empty and the vision encoder loaded and precompiled).
        "--limit-mm-per-prompt", '{"image":0,"audio":0,"video":0}',
    ]


def test_vision_limits_are_compact_json_and_on_tpu_disable_chunked_mm_input():
    args = vllm_serve_args(ServingConfig(mm_limits={"image": 4}))
    assert "--language-model-only" not in args
    assert args[args.index("--limit-mm-per-prompt") + 1] == '{"image":4,"audio":0,"video":0}'
    assert args.count("--disable-chunked-mm-input") == 1


@pytest.mark.parametrize("cfg", [
    ServingConfig(),  # text-only: nothing multimodal to chunk
    ServingConfig(mm_limits={"image": 0}),
    ServingConfig(mm_limits={"image": 4, "audio": 1}, backend="gpu"),  # upstream vLLM decides for itself
], ids=["text-only", "all-zero", "gpu"])
def test_chunked_mm_input_is_left_alone_without_multimodal_input_on_tpu(cfg):
    assert "--disable-chunked-mm-input" not in vllm_serve_args(cfg)


@pytest.mark.parametrize("chips", [1, 4, 8])
def test_tensor_parallel_size_unresolved_is_every_chip(chips):
    args = vllm_serve_args(ServingConfig(chips=chips))
    assert args[args.index("--tensor-parallel-size") + 1] == str(chips)


def test_engines_of_a_vm_differ_in_name_port_and_chips_only():
    """Two engines of two chips each on a ct6e-standard-4t: tpu-inference's per-rank libtpu variables
    (tpu_inference/worker/tpu_worker.py _setup_dp_chip_isolation) with chips_per_rank 2."""
    cfg = ServingConfig(chips=4, tensor_parallel_size=2)
    assert (cfg.engines, engine_addresses(cfg)) == (2, [("vllm-0", 8100), ("vllm-1", 8101)])
    assert engine_tpu_env(cfg, 1) == {"TPU_VISIBLE_CHIPS": "2,3", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1",
                                      "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": "5001",
                                      "TPU_PROCESS_ADDRESSES": "localhost:5001", "CLOUD_TPU_TASK_ID": "0"}
    first, second = (tpu_container_run_args(cfg, "h", engine=i) for i in (0, 1))
    differ = [(a, b) for a, b in zip(first, second, strict=True) if a != b]
    assert differ == [("vllm-0", "vllm-1"), ("TPU_VISIBLE_CHIPS=0,1", "TPU_VISIBLE_CHIPS=2,3"),
                      ("TPU_PROCESS_PORT=5000", "TPU_PROCESS_PORT=5001"),
                      ("TPU_PROCESS_ADDRESSES=localhost:5000", "TPU_PROCESS_ADDRESSES=localhost:5001"),
                      ("8100", "8101")]
    assert first[first.index("--host") + 1] == "127.0.0.1"  # behind the front only
    lone = ServingConfig(chips=4, tensor_parallel_size=4)
    assert engine_tpu_env(lone, 0) == {} and engine_addresses(lone) == [("vllm", 8000)]
    assert "TPU_VISIBLE_CHIPS" not in " ".join(tpu_container_run_args(lone, "h"))


def test_the_engine_count_is_part_of_the_hash_and_a_lone_engines_hash_is_unchanged():
    assert config_hash(ServingConfig(chips=4, tensor_parallel_size=4)) == config_hash(
        ServingConfig(chips=1, tensor_parallel_size=4))  # one engine either way: the argv alone, as before engines
    assert config_hash(ServingConfig(chips=4, tensor_parallel_size=1)) != config_hash(
        ServingConfig(chips=8, tensor_parallel_size=1))


def test_auto_tensor_parallel_size_is_the_fewest_chips_that_hold_the_weights():
    assert auto_tensor_parallel_size("google/gemma-4-E2B-it", 8, 0.9) == 1  # 9.5 GiB < 31.24 × 0.9
    assert auto_tensor_parallel_size("google/gemma-4-E2B-it", 4, 0.25) == 2  # 9.5 / 2 < 7.8 < 9.5
    assert auto_tensor_parallel_size("org/no-preset", 4, 0.9) == 4


def test_optional_flags_appear_only_when_set_and_extra_args_come_last():
    cfg = ServingConfig(kv_cache_dtype="fp8", tool_call_parser="", enable_auto_tool_choice=False,
                        reasoning_parser="", extra_args=("--seed", "7"))
    args = vllm_serve_args(cfg)
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert not {"--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser"} & set(args)
    assert args[-2:] == ["--seed", "7"]


def test_container_gets_the_token_by_name_only_and_the_reference_runtime_flags():
    run = tpu_container_run_args(ServingConfig(), "abc123")
    assert run[run.index("HF_TOKEN") - 1] == "-e" and not any(a.startswith("HF_TOKEN=") for a in run)
    for flag in ("--privileged", "--net=host", "/dev/shm:/dev/shm", "tpu-serve.config-hash=abc123"):
        assert flag in run
    assert run[run.index("/dev/shm:/dev/shm") - 1] == "-v"
    assert "--shm-size" not in run  # the host's /dev/shm is bind-mounted: Docker would ignore a size
    image_at = run.index(VLLM_TPU_IMAGE)
    assert run[image_at + 1:image_at + 3] == ["vllm", "serve"]
    assert run[image_at + 3:] == vllm_serve_args(ServingConfig())


def test_container_caches_live_on_the_cache_disk_and_both_xla_variables_name_one_directory():
    run = tpu_container_run_args(ServingConfig(), "abc123")
    mounts = [run[i + 1] for i, arg in enumerate(run) if arg == "-v"]
    env = [run[i + 1] for i, arg in enumerate(run) if arg == "-e"]
    assert mounts == ["/dev/shm:/dev/shm", "/var/lib/tpu-serve/cache/huggingface:/cache/huggingface",
                      "/var/lib/tpu-serve/cache/xla/{xla_cache_key}:/cache/xla"]
    assert env == ["HF_HOME=/cache/huggingface", "VLLM_XLA_CACHE_PATH=/cache/xla", "JAX_COMPILATION_CACHE_DIR=/cache/xla",
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0", "HF_TOKEN"]
    assert not any("VLLM_XLA_CHECK_RECOMPILATION" in arg for arg in run)  # raises on any compile after warm-up
    assert not any("/dev/shm" in arg for arg in env)  # weights no longer land in RAM


def test_config_hash_follows_every_served_option():
    base = ServingConfig()
    variants = [dataclasses.replace(base, image="vllm/vllm-tpu@sha256:00"),
                dataclasses.replace(base, max_model_len=4096), dataclasses.replace(base, mm_limits={"image": 1}),
                dataclasses.replace(base, extra_args=("--seed", "1")), dataclasses.replace(base, tensor_parallel_size=4)]
    hashes = {config_hash(base)} | {config_hash(v) for v in variants}
    assert len(hashes) == 1 + len(variants)
    assert config_hash(ServingConfig()) == config_hash(base)


@pytest.mark.parametrize("arg, name", [("--max_model_len=5", "--max-model-len"), ("--no-enable-auto-tool-choice",
                                       "--enable-auto-tool-choice"), ("7", None), ("--seed", "--seed"),
                                       ("-tp", "--tensor-parallel-size"), ("-tp=4", "--tensor-parallel-size")])
def test_option_name_normalises_spellings(arg, name):
    assert option_name(arg) == name


@pytest.mark.parametrize("changes, key", [
    ({"max_model_len": 0}, "maxModelLen"),
    ({"gpu_memory_utilization": 1.2}, "gpuMemoryUtilization"),
    ({"max_num_batched_tokens": -1}, "maxNumBatchedTokens"),
    ({"kv_cache_dtype": "fp4"}, "kvCacheDtype"),
    ({"tool_call_parser": ""}, "enableAutoToolChoice"),
    ({"extra_args": ("--max_model_len", "1024")}, "extraArgs"),
    ({"extra_args": ("--device-memory-utilization=0.5",)}, "extraArgs"),
    ({"extra_args": ("--no-enable-auto-tool-choice",)}, "extraArgs"),
    ({"extra_args": ("--tensor-parallel-size", "4")}, "extraArgs"),
    ({"extra_args": ("-tp", "4")}, "extraArgs"),
    ({"extra_args": ("--limit_mm_per_prompt={}",)}, "extraArgs"),
    ({"tensor_parallel_size": -1}, "tensorParallelSize"),
    ({"tensor_parallel_size": 3, "chips": 4}, "tensorParallelSize"),
    ({"extra_args": ("--data-parallel-size", "4")}, "extraArgs"),
    ({"model": "google/gemma-4-E2B-it-qat-w4a16-ct"}, "model"),
    ({"model": "google/gemma-4-e2b-it-qat-q4_0-unquantized"}, "model"),
    ({"model": "google/gemma-4-E4B-it-qat-w4a16-ct"}, "model"),
    ({"model": "google/gemma-4-E4B-it-qat-q4_0-unquantized"}, "model"),
])
def test_bad_serving_options_name_their_key(changes, key):
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(ServingConfig(), **changes).validate()
    assert err.value.key == key and str(err.value).startswith(f"{key}: ")


@pytest.mark.parametrize("model, cause", [
    ("google/gemma-4-E2B-it-qat-w4a16-ct", "per_layer_model_projection"),
    ("google/gemma-4-E4B-it-qat-w4a16-ct", "per_layer_model_projection"),
    ("google/gemma-4-E2B-it-qat-q4_0-unquantized", "k_norm"),
    ("google/gemma-4-E4B-it-qat-q4_0-unquantized", "k_norm"),
])
def test_each_known_broken_checkpoint_gets_its_own_reason_and_can_be_overridden(model, cause):
    broken = ServingConfig(model=model)
    with pytest.raises(ConfigError, match="tpu-inference#3225") as err:
        broken.validate()
    assert cause in str(err.value)
    dataclasses.replace(broken, allow_known_broken_model=True).validate()
    broken.validate(backend="local")  # the TPU-only breakage does not apply elsewhere


def test_the_unquantized_e2b_and_e4b_checkpoints_are_not_refused():
    for model in ("google/gemma-4-E2B-it", "google/gemma-4-E4B-it"):
        ServingConfig(model=model).validate()


@pytest.mark.parametrize("raw, expected", [("text-only", None), ('{"image":4,"audio":1}', {"image": 4, "audio": 1}),
                                           ({"image": 0}, {"image": 0})])
def test_mm_limits_parse(raw, expected):
    assert parse_mm_limits(raw) == expected


@pytest.mark.parametrize("raw", ["{image: 4}", '["image"]', '{"image": -1}', '{"image": 1.5}', '{"image": true}', "{}"])
def test_bad_mm_limits_name_the_key(raw):
    with pytest.raises(ConfigError, match="^multimodalLimits: "):
        parse_mm_limits(raw)


# --- issue #12: every limit from its valid side, every message in full, the argv and its digest pinned ------------

@pytest.mark.parametrize("changes", [
    {"max_model_len": 1}, {"gpu_memory_utilization": 1.0}, {"gpu_memory_utilization": 0.01},
    {"max_num_batched_tokens": 1}, {"tensor_parallel_size": 1}, {"kv_cache_dtype": "fp8_e5m2"},
    {"enable_auto_tool_choice": False, "tool_call_parser": ""}, {"mm_limits": {"image": 0}},
    {"extra_args": ("--seed", "7", "--no-enable-prefix-caching")}, {"model": "google/gemma-4-E2B-it-qat-q4_0-gguf"},
    {"image": "vllm/vllm-tpu:nightly"}, {"image": "us-docker.pkg.dev/p/r/vllm-tpu:v1@sha256:" + "0" * 64},
    {"image": "localhost:5000/vllm@sha512:" + "f" * 128},
], ids=lambda changes: ",".join(f"{k}={v}" for k, v in changes.items()))
def test_values_at_the_limits_are_accepted(changes):
    cfg = dataclasses.replace(ServingConfig(), **changes)
    assert cfg.validate() is cfg


@pytest.mark.parametrize("changes, message", [
    ({"model": "  "}, "model: must name a model"),
    ({"image": "vllm/vllm-tpu@sha256:" + "a" * 63}, "containerImage: 'vllm/vllm-tpu@sha256:" + "a" * 63 + "' has a "
     "malformed digest: sha256 takes 64 hex digits, got 63; use the digest as the registry prints it (`docker buildx "
     "imagetools inspect IMAGE`)"),
    ({"image": "vllm/vllm-tpu@sha256:" + "E" * 64}, "containerImage: 'vllm/vllm-tpu@sha256:" + "E" * 64 + "' has a "
     "malformed digest: sha256 digits must be lowercase hex (the OCI image spec forbids A-F); use the digest as the "
     "registry prints it (`docker buildx imagetools inspect IMAGE`)"),
    ({"image": "vllm/vllm-tpu nightly"}, "containerImage: 'vllm/vllm-tpu nightly' is not an image reference like "
     "vllm/vllm-tpu:nightly or vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507"),
    ({"max_model_len": 0}, "maxModelLen: must be a positive integer, got 0"),
    ({"gpu_memory_utilization": 0.0}, "gpuMemoryUtilization: must be in (0, 1], got 0.0"),
    ({"gpu_memory_utilization": 1.01}, "gpuMemoryUtilization: must be in (0, 1], got 1.01"),
    ({"max_num_batched_tokens": 0}, "maxNumBatchedTokens: must be a positive integer, got 0"),
    ({"tensor_parallel_size": -1}, "tensorParallelSize: must be 0 (auto) or a positive integer, got -1"),
    ({"kv_cache_dtype": "fp4"}, "kvCacheDtype: 'fp4' is not one of auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2, "
                                "fp8_inc, fp8_ds_mla, nvfp4_ds_mla, turboquant_k8v4, turboquant_4bit_nc, "
                                "turboquant_k3v4_nc, turboquant_3bit_nc, ultraquant_4bit, int4_per_token_head, "
                                "int8_per_token_head, fp8_per_token_head, nvfp4, nvfp4_4over6"),
    ({"kv_cache_dtype": "fp8_inc"}, "kvCacheDtype: 'fp8_inc' crashes the TPU backend at boot: tpu-inference's runner "
                                    "maps the name with jnp.dtype(), which knows only auto, float16, bfloat16, fp8, "
                                    "fp8_e4m3, fp8_e5m2 (tpuserve/data/tpu-inference-support.json); use one of those"),
    ({"mm_limits": {"images": 1}}, "multimodalLimits: 'images' is not a modality vLLM takes; use image, audio, video"),
    ({"model_impl": "jax"}, "modelImpl: 'jax' is not one of auto, flax_nnx, vllm"),
    ({"tool_call_parser": ""}, "enableAutoToolChoice: --enable-auto-tool-choice needs toolCallParser to be set"),
    ({"mm_limits": {"image": -1}}, "multimodalLimits: limit for 'image' must be a non-negative integer, got -1"),
    ({"mm_limits": {}}, "multimodalLimits: must be a non-empty mapping of modality to count, got {}"),
    ({"extra_args": ("--seed", 3)}, "extraArgs: every entry must be a string, got 3"),
    ({"extra_args": ("--max_model_len", "1")}, "extraArgs: '--max_model_len' repeats --max-model-len, which is set by "
                                               "maxModelLen; set it there instead"),
    ({"extra_args": ("--api-key", "x")}, "extraArgs: --api-key takes a secret, which would sit in plain text in the "
                                         "startup script, the instance metadata and the vllmArgs output; the stack "
                                         "has no secret path for it yet (the endpoint is internal: reach it through "
                                         "IAP, or front it with `tpuserve litellm`'s proxy and its master key)"),
    ({"extra_args": ("--hf-token=x",)}, "extraArgs: --hf-token takes a secret, which would sit in plain text in the "
                                        "startup script, the instance metadata and the vllmArgs output; the Hugging "
                                        "Face token reaches the container through its environment only: set "
                                        "hfTokenSecretId (a Secret Manager secret) or `pulumi config set --secret "
                                        "hfToken`"),
    ({"extra_args": ("--served-model-name", "x")}, "extraArgs: --served-model-name would rename the served model: the "
                                                   "boot check, the gate and the toolkit ask for `model` by name; give "
                                                   "clients other names with `tpuserve litellm --alias`"),
    ({"model": "google/gemma-4-E2B-it-qat-q4_0-unquantized"},
     "model: 'google/gemma-4-E2B-it-qat-q4_0-unquantized': Gemma 4 E2B/E4B QAT q4_0-unquantized checkpoints do not "
     "load on TPU: they omit k_norm (and k/v_proj) of the KV-shared layers, which tpu-inference's Gemma 4 still "
     "requires (vllm-project/tpu-inference#3225). Set allowKnownBrokenModel to deploy it anyway."),
], ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None)
def test_each_refusal_in_full(changes, message):
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(ServingConfig(), **changes).validate()
    assert str(err.value) == message and err.value.key == message.split(":")[0]


@pytest.mark.parametrize("name", ["--api-key", "--hf-token", "--token", "--secret", "--password", "--passwd",
                                  "--credential", "--credentials", "--ssl-keyfile-password", "--key"])
def test_options_that_take_a_secret_are_refused(name):
    with pytest.raises(ConfigError, match=f"^extraArgs: {name} takes a secret"):
        check_extra_args((name, "x"))


@pytest.mark.parametrize("name", ["--seed", "--keyboard", "--tokenizer", "--disable-log-requests"])
def test_options_that_only_look_secret_are_allowed(name):
    check_extra_args((name, "x"))


@pytest.mark.parametrize("raw, message", [
    ("{x", "multimodalLimits: not 'text-only' and not valid JSON (Expecting property name enclosed in double quotes): "
           "'{x'"),
    ("[]", "multimodalLimits: must be a non-empty mapping of modality to count, got []"),
])
def test_bad_mm_limits_in_full(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_mm_limits(raw)
    assert str(err.value) == message


@pytest.mark.parametrize("arg, name", [("--max_model_len=a=b", "--max-model-len"), ("-tp=4=5", "--tensor-parallel-size"),
                                       ("--no-x=1", "--x")])
def test_option_name_splits_at_the_first_equals_sign(arg, name):
    assert option_name(arg) == name


def test_the_argv_with_every_optional_flag():
    cfg = ServingConfig(kv_cache_dtype="fp8", mm_limits={"image": 1}, extra_args=("--seed", "7"))
    assert vllm_serve_args(cfg) == [
        "google/gemma-4-E2B-it", "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "65536",
        "--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "4096", "--tensor-parallel-size", "1",
        "--kv-cache-dtype", "fp8", "--enable-auto-tool-choice", "--tool-call-parser", "gemma4",
        "--reasoning-parser", "gemma4", "--limit-mm-per-prompt", '{"image":1,"audio":0,"video":0}',
        "--disable-chunked-mm-input",
        "--seed", "7"]


def test_the_docker_run_argv_in_full():
    assert tpu_container_run_args(ServingConfig(max_model_len=1024), "abc123") == [
        "run", "--detach", "--name", "vllm", "--privileged", "--net=host", "-v", "/dev/shm:/dev/shm",
        # the warm caches of issue 13: weights on the cache disk, XLA's compile cache keyed by config
        "-v", "/var/lib/tpu-serve/cache/huggingface:/cache/huggingface", "-e", "HF_HOME=/cache/huggingface",
        "-v", "/var/lib/tpu-serve/cache/xla/{xla_cache_key}:/cache/xla", "-e", "VLLM_XLA_CACHE_PATH=/cache/xla",
        "-e", "JAX_COMPILATION_CACHE_DIR=/cache/xla", "-e", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0",
        "-e", "HF_TOKEN", "--label", "tpu-serve.config-hash=abc123", VLLM_TPU_IMAGE,
        "vllm", "serve", "google/gemma-4-E2B-it", "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "1024",
        "--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "4096", "--tensor-parallel-size", "1",
        "--enable-auto-tool-choice", "--tool-call-parser", "gemma4", "--reasoning-parser", "gemma4",
        "--limit-mm-per-prompt", '{"image":0,"audio":0,"video":0}']


def test_the_config_hash_of_the_defaults_is_pinned():
    """sha256 of the compact JSON of [image, argv], 16 hex digits: a VM booted by an older toolkit reports the same
    hash for the same config, so the gate does not re-run for nothing."""
    payload = json.dumps([VLLM_TPU_IMAGE, vllm_serve_args(ServingConfig())], separators=(",", ":"))
    assert config_hash(ServingConfig()) == hashlib.sha256(payload.encode()).hexdigest()[:16] == "cb068c86421fe6af"


def test_a_setting_records_its_key_and_doc_and_copies_a_mutable_default():
    plain = setting("maxModelLen", "Longest prompt.", 5)
    assert (plain.default, plain.default_factory, dict(plain.metadata)) == (
        5, dataclasses.MISSING, {"key": "maxModelLen", "doc": "Longest prompt."})
    listed = setting("extraArgs", "More args.", ["--seed"])
    assert listed.default is dataclasses.MISSING and listed.default_factory() == ["--seed"]
    assert listed.default_factory() is not listed.default_factory()  # a fresh list each time
    with pytest.raises(ValueError, match="cannot specify both default and default_factory"):
        setting("k", "d", ["x"], default_factory=list)  # an explicit factory is not silently replaced
    assert [(f.metadata["key"], f.default) for f in dataclasses.fields(ServingConfig)[:3]] == [
        ("model", "google/gemma-4-E2B-it"), ("containerImage", VLLM_TPU_IMAGE), ("maxModelLen", 65536)]


# --- issue #24: what the TPU can serve, from tpuserve/data/tpu-inference-support.json ------------------------------

def test_the_support_data_names_its_upstream_commits():
    sources = tpu_support()["sources"]
    assert sources["tpu-inference"]["commit"] == "b8692ff01fa191343836996c27a39dc95f008b88"
    assert sources["vllm"]["version"] == "0.32.0"
    assert MODALITIES == ("image", "audio", "video")
    assert set(TPU_KV_CACHE_DTYPES) < set(KV_CACHE_DTYPES)


@pytest.mark.parametrize("limits", [None, {"image": 4}, {"audio": 0}, {"video": 0, "image": 2}],
                         ids=["text-only", "image", "audio-0", "reordered"])
@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_every_argv_names_every_modality_so_none_falls_back_to_999(limits, backend):
    cfg = ServingConfig(mm_limits=limits, backend=backend).validate()
    sent = json.loads(vllm_serve_args(cfg)[vllm_serve_args(cfg).index("--limit-mm-per-prompt") + 1])
    assert list(sent) == ["image", "audio", "video"]
    assert sent == {m: (limits or {}).get(m, 0) for m in ("image", "audio", "video")}


@pytest.mark.parametrize("limits, modality", [({"image": 4, "audio": 1}, "audio"), ({"video": 1}, "video")])
def test_audio_and_video_on_the_jax_gemma4_are_refused_naming_the_key_and_the_way_out(limits, modality):
    with pytest.raises(ConfigError) as err:
        ServingConfig(mm_limits=limits).validate()
    message = str(err.value)
    assert err.value.key == "multimodalLimits" and "\n" not in message
    assert message.startswith(f"multimodalLimits: {modality}: 1 cannot be served on TPU with MODEL_IMPL_TYPE=flax_nnx ")
    assert "tpu_inference/models/jax/gemma4_mm.py" in message and "b8692ff" in message
    assert message.endswith(f"set {modality} to 0, or modelImpl: vllm to serve it through that implementation")


def test_audio_on_the_torchax_path_is_served_with_its_env_var_in_the_container():
    cfg = ServingConfig(mm_limits={"image": 4, "audio": 1}, model_impl="vllm").validate()
    run = tpu_container_run_args(cfg, "abc123")
    assert run[run.index("MODEL_IMPL_TYPE=vllm") - 1] == "-e"
    assert run.index("MODEL_IMPL_TYPE=vllm") < run.index(cfg.image)  # a docker option, not a vllm argument
    assert untested_modalities(cfg) == ["audio"]  # the stack warns: tpu-inference never tests it
    assert "MODEL_IMPL_TYPE=vllm" not in tpu_container_run_args(ServingConfig(), "abc123")
    assert config_hash(cfg) != config_hash(dataclasses.replace(cfg, model_impl="auto"))
    assert backend_env(cfg) == {"MODEL_IMPL_TYPE": "vllm"}


def test_model_impl_applies_to_the_tpu_backend_only_and_models_without_data_are_not_judged():
    with pytest.raises(ConfigError, match="^modelImpl: 'vllm' chooses a tpu-inference model implementation"):
        ServingConfig(model_impl="vllm").validate(backend="gpu")
    assert ServingConfig(mm_limits={"image": 1, "audio": 1}).validate(backend="gpu")  # upstream vLLM: its own call
    assert ServingConfig(model="Qwen/Qwen2.5-VL-7B-Instruct", mm_limits={"video": 1}).validate()  # no evidence
    assert backend_env(ServingConfig(model_impl="vllm", backend="gpu")) == {}


@pytest.mark.parametrize("dtype", ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"])
def test_the_kv_dtypes_tpu_inference_maps_are_allowed_on_tpu(dtype):
    assert ServingConfig(kv_cache_dtype=dtype).validate()


@pytest.mark.parametrize("dtype", ["fp8_inc", "fp8_ds_mla", "fp8_per_token_head", "int8_per_token_head", "nvfp4"])
def test_kv_dtypes_the_tpu_runner_cannot_map_are_refused_there_only(dtype):
    with pytest.raises(ConfigError, match=f"^kvCacheDtype: '{dtype}' crashes the TPU backend at boot"):
        ServingConfig(kv_cache_dtype=dtype).validate()
    assert ServingConfig(kv_cache_dtype=dtype).validate(backend="gpu")


@pytest.mark.parametrize("option, key", [("--kv-cache-dtype", "kvCacheDtype"), ("--limit-mm-per-prompt",
                                                                                 "multimodalLimits")])
def test_extra_args_may_not_set_the_kv_dtype_or_the_modality_limits_behind_the_checks(option, key):
    """Both are judged above (the dtype against the TPU runner, the limits against the model implementation): an
    extraArgs copy would bypass that and vLLM's parser keeps the last value given."""
    assert FIRST_CLASS_OPTIONS[option] == key
    for arg in ([option, "x"], [f"{option}=x"], [option.replace("-", "_").replace("__", "--", 1), "x"]):
        with pytest.raises(ConfigError, match=f"^extraArgs: '{arg[0]}' repeats {option}, which is set by {key}"):
            check_extra_args(tuple(arg))


def test_the_gke_pod_gets_the_same_model_impl_env_and_the_stack_warns_of_untested_modalities():
    from components.config import build_stack_config
    from components.k8s_serving import ServingManifestArgs, vllm_container
    from tests.fakes.pulumi_harness import stack_file_config

    raw = {**stack_file_config("dev"), "modelImpl": "vllm", "multimodalLimits": '{"image":2,"video":1}'}
    cfg = build_stack_config(raw)
    args = ServingManifestArgs("tpu-serve", "tpu-serve", cfg.serving, "projects/p/secrets/s", "sa@p", 1, {}, 1, 1,
                               600, config_hash(cfg.serving))
    assert {"name": "MODEL_IMPL_TYPE", "value": "vllm"} in vllm_container(args)["env"]
    [warning] = [w for w in cfg.warnings() if w.startswith("multimodalLimits:")]
    assert warning.startswith("multimodalLimits: video on modelImpl vllm runs vLLM's own Gemma 4 code through torchax")
    assert not [w for w in build_stack_config(stack_file_config("prod")).warnings() if "multimodal" in w]
