"""The disabled-modality check, both sides: `tpuserve probe refusals` (tpuserve/measure/probe.py) fails every answer
that is not a 4xx; the VM's boot check (vm/readycheck.py `refusals`) fails only a server that stops serving after one,
and warns of the rest, on the same fake servers (fake server: a vLLM-shaped chat route that answers multimodal parts
as told, tests/fakes/fake_openai.py bodies). The real CPU vLLM's answers are in tests/e2e/test_probe_e2e.py."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from tests.fakes.fake_openai import FAKE_MODEL, completion, error
from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.client import ChatClient
from tpuserve.images import modality_part
from tpuserve.measure.probe import FAIL, PASS, disabled_modalities, run_refusals
from tpuserve.serving import ServingConfig, vllm_serve_args
from vm import readycheck

ROOT = Path(__file__).resolve().parents[2]
PART_MODALITY = {"image_url": "image", "input_audio": "audio", "video_url": "video"}
# vLLM 0.32's refusal of a modality limited to 0 on a multimodal model (vllm/multimodal/processing/context.py
# validate_num_items); a text-only model answers 400 "<model> is not a multimodal model" instead (measured on the
# real CPU vLLM: tests/e2e/test_probe_e2e.py)
LIMIT_0 = "At most 0 {}(s) may be provided in one prompt."


class Server(FakeServer):
    """/health, /v1/models and chat; `answers` maps a modality to the status its request gets (400 by default);
    `dies_on` makes the server stop answering (health 503, chat 500) once a request of that modality arrived."""

    def __init__(self, answers: dict[str, int] | None = None, dies_on: str = "", says: str = "hello"):
        super().__init__({("GET", "/health"): self.health, ("GET", "/v1/models"): self.models,
                          ("POST", "/v1/chat/completions"): self.chat})
        self.answers, self.dies_on, self.dead, self.says = answers or {}, dies_on, False, says

    def health(self, request: Request) -> Response:
        return Response(503 if self.dead else 200)

    def models(self, request: Request) -> Response:
        return Response(200, {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]})

    def chat(self, request: Request) -> Response:
        content = request.json()["messages"][0]["content"]
        if self.dead:
            return error(500, "EngineCore encountered an issue")
        if isinstance(content, str):
            return Response(200, completion(self.says))
        modality = next(PART_MODALITY[p["type"]] for p in content if p["type"] in PART_MODALITY)
        self.dead = self.dead or modality == self.dies_on
        status = self.answers.get(modality, 400)
        return Response(200, completion("a square")) if status == 200 else error(status, LIMIT_0.format(modality))


ALL = ("image", "audio", "video")
CASES = {  # name -> (server, the probe's verdicts in ALL order, the boot check: still serving, modalities warned of)
    "refuses all": (lambda: Server(), [PASS, PASS, PASS], True, []),
    "accepts audio": (lambda: Server({"audio": 200}), [PASS, FAIL, PASS], True, ["audio"]),
    "engine error on video": (lambda: Server({"video": 500}), [PASS, PASS, FAIL], True, ["video"]),
    "refuses audio but dies": (lambda: Server(dies_on="audio"), [PASS, FAIL, FAIL], False, []),
}


@pytest.mark.parametrize("name", CASES)
def test_the_probe_fails_what_the_boot_check_only_warns_of_unless_the_server_dies(name):
    make, expected, serving, warned = CASES[name]
    with make() as fake:
        results = run_refusals(ChatClient(fake.url, FAKE_MODEL), ALL)
    assert [r.verdict for r in results] == expected
    with make() as fake:
        result = readycheck.refusals(fake.url, FAKE_MODEL, {m: modality_part(m) for m in ALL}, timeout_s=5)
    assert result.serving == serving, result.detail
    assert [warning.split(" ")[1] for warning in result.warnings] == warned  # "a <modality> request, ..."
    assert all(w.endswith("instead of a 4xx; the server still serves") for w in result.warnings)
    if serving:
        assert result.detail.endswith("; still serving")


def test_an_engine_that_answers_empty_text_after_the_requests_still_serves():
    """Random weights (the e2e tier's tiny model) may answer a completion with no text: the boot check asks whether the
    engine still answers, not what it says (readiness before it judged the text: the gate's rule)."""
    with Server(says="") as fake:
        result = readycheck.refusals(fake.url, FAKE_MODEL, {m: modality_part(m) for m in ALL}, timeout_s=5)
        assert (result.serving, result.warnings) == (True, []), result.detail
        assert readycheck.check(fake.url, FAKE_MODEL, 5) == (False, f"completion: {readycheck.EMPTY_ANSWER}")
    with Server({"audio": 500}, dies_on="audio", says="") as fake:
        result = readycheck.refusals(fake.url, FAKE_MODEL, {"audio": modality_part("audio")}, timeout_s=5)
    assert not result.serving and "no longer served (health: /health answered HTTP 503)" in result.detail


def test_verdict_reasons_say_what_was_wrong():
    with Server({"audio": 200, "video": 500}) as fake:
        image, audio, video = run_refusals(ChatClient(fake.url, FAKE_MODEL), ALL)
    assert image.reason == f"HTTP 400: {LIMIT_0.format('image')}; still serving"
    assert audio.reason == "answered HTTP 200: the audio limit is not applied, so any client can send it"
    assert video.reason.startswith("HTTP 500 instead of a 4xx: the request reached the engine")
    with Server(dies_on="image") as fake:
        result = readycheck.refusals(fake.url, FAKE_MODEL, {"image": modality_part("image")}, timeout_s=5)
    assert (result.serving, result.detail) == (False, "after the image request(s) the server no longer serves: "
                                                      "health: /health answered HTTP 503")
    with Server({"audio": 500}, dies_on="audio") as fake:
        result = readycheck.refusals(fake.url, FAKE_MODEL, {"audio": modality_part("audio")}, timeout_s=5)
    assert (result.serving, result.detail) == (False, (
        f"a audio request, which this deployment cannot serve, answered HTTP 500 ({LIMIT_0.format('audio')}) instead of "
        "a 4xx, and then the server no longer served (health: /health answered HTTP 503): one such request can take "
        "the engine down"))


def test_each_part_is_real_media_of_its_modality():
    image, audio, video = (modality_part(m) for m in ALL)
    assert base64.b64decode(image["image_url"]["url"].split(",", 1)[1]).startswith(b"\x89PNG")
    with wave.open(io.BytesIO(base64.b64decode(audio["input_audio"]["data"]))) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (1, 16000, 4000)
    header, frames = video["video_url"]["url"].split(",", 1)
    assert header == "data:video/jpeg;base64" and len(frames.split(",")) == 2
    with pytest.raises(ValueError, match="no probe media for modality 'smell'"):
        modality_part("smell")


def test_the_stacks_disabled_modalities_come_from_its_argv():
    assert disabled_modalities(vllm_serve_args(ServingConfig())) == ALL
    assert disabled_modalities(vllm_serve_args(ServingConfig(mm_limits={"image": 4}))) == ("audio", "video")
    assert disabled_modalities(["m", "--port", "1"]) is None and disabled_modalities(None) is None


def test_the_cli_reads_the_modalities_from_the_stack_and_exits_1_under_strict_when_one_is_accepted(tmp_path):
    outputs = tmp_path / "outputs.json"
    with Server({"video": 200}) as fake:
        outputs.write_text(json.dumps({"target": "local", "endpoint": f"{fake.url}/v1", "model": FAKE_MODEL,
                                       "vllmArgs": vllm_serve_args(ServingConfig(mm_limits={"image": 4}))}))
        done = subprocess.run([sys.executable, "-m", "tpuserve", "probe", "refusals", "--stack-outputs",
                               str(outputs), "--json", "--strict"], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
    assert done.returncode == 1, done.stderr
    results = json.loads(done.stdout)["results"]
    assert [(r["scenario"], r["verdict"]) for r in results] == [("audio refused", PASS), ("video refused", FAIL)]
    bad = subprocess.run([sys.executable, "-m", "tpuserve", "probe", "refusals", "--url", "http://127.0.0.1:9",
                          "--modalities", "smell"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "--modalities" in bad.stderr and "smell: choose from image, audio, video" in bad.stderr
