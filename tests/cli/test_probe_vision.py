"""Vision probe against the fake OpenAI server (tests/fakes/fake_openai.py), and the shipped probe images themselves."""

from __future__ import annotations

import base64
import struct
import zlib
from importlib import resources

import pytest

from tests.fakes.fake_openai import BOOT_422_MESSAGE, FAKE_MODEL, FakeOpenAI, completion
from tests.fakes.httpfake import Response
from tpuserve.client import ChatClient
from tpuserve.images import IMAGE_DIR, image_data_uri
from tpuserve.measure.probe import FAIL, PASS, SKIPPED, VISION_SCENARIOS, run_vision


def decode_rgb_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of an 8-bit RGB PNG without filters (how the probe images are written)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = {}, 8
    while offset < len(data):
        (length,), kind = struct.unpack(">I", data[offset:offset + 4]), data[offset + 4:offset + 8]
        chunks[kind] = chunks.get(kind, b"") + data[offset + 8:offset + 8 + length]
        offset += 12 + length
    width, height, depth, color_type = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color_type) == (8, 2)
    raw, stride = zlib.decompress(chunks[b"IDAT"]), 1 + 3 * width
    rows = [raw[y * stride:(y + 1) * stride] for y in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, [row[1:] for row in rows]


def colored_runs(row: bytes) -> list[tuple[int, int, int]]:
    """Colors of the non-white runs along one pixel row, left to right."""
    pixels = [tuple(row[i:i + 3]) for i in range(0, len(row), 3)]
    runs = []
    for previous, pixel in zip([(255, 255, 255)] + pixels[:-1], pixels, strict=True):
        if pixel != (255, 255, 255) and pixel != previous:
            runs.append(pixel)
    return runs


@pytest.mark.parametrize("scenario, image, question, answers", VISION_SCENARIOS)
def test_each_image_holds_what_its_question_expects(scenario: str, image: str, question: str,
                                                    answers: tuple[str, ...]) -> None:
    _, height, rows = decode_rgb_png(resources.files("tpuserve").joinpath(IMAGE_DIR, image).read_bytes())
    runs = colored_runs(rows[height // 2])
    assert len(set(runs)) == len(runs)  # distinct colors, so counting squares is unambiguous
    if "count" in scenario:
        assert str(len(runs)) in answers
    else:
        assert len(runs) == 1 and runs[0][0] > 200 and max(runs[0][1:]) < 60 and "red" in answers


def test_images_are_sent_as_base64_data_uris() -> None:
    uri = image_data_uri("squares-3.png")
    assert uri.startswith("data:image/png;base64,")
    assert base64.b64decode(uri.split(",", 1)[1])[:4] == b"\x89PNG"


def test_a_capable_server_passes_and_the_boot_422_is_retried_once_and_reported() -> None:
    with FakeOpenAI(vision="422-then-200") as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [r.verdict for r in results] == [PASS, PASS, PASS]
    assert len(fake.chat_bodies()) == len(VISION_SCENARIOS) + 1
    assert "first attempt HTTP 422" in results[0].reason and BOOT_422_MESSAGE in results[0].reason
    assert all(not r.evidence["retry"] for r in results[1:])


def test_a_text_only_server_is_skipped_with_the_reason_after_one_request() -> None:
    with FakeOpenAI(vision="text-only") as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [r.verdict for r in results] == [SKIPPED] * len(VISION_SCENARIOS)
    assert all(r.reason.startswith("server is text-only: ") and "not a multimodal model" in r.reason
               for r in results)
    assert len(fake.chat_bodies()) == 1


def test_a_wrong_answer_fails_with_what_was_said() -> None:
    with FakeOpenAI() as fake:
        fake.routes[("POST", "/v1/chat/completions")] = lambda request: Response(200, completion("Blue."))
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [r.verdict for r in results] == [FAIL] * len(VISION_SCENARIOS)
    assert "answered 'Blue.'" in results[0].reason and "expected one of ['3', 'three']" in results[0].reason


def test_a_422_that_persists_after_the_retry_is_a_fail_not_a_skip() -> None:
    with FakeOpenAI() as fake:
        fake.routes[("POST", "/v1/chat/completions")] = lambda request: Response(
            422, {"error": {"message": BOOT_422_MESSAGE, "code": 422}})
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [r.verdict for r in results] == [FAIL] * len(VISION_SCENARIOS)
    assert results[0].reason == f"server error: HTTP 422: {BOOT_422_MESSAGE}"
    assert len(fake.requests) == 2 * len(VISION_SCENARIOS)


# --- issue #12, second run -----------------------------------------------------------------------------------------

# vLLM 0.32's refusal of an image beyond --limit-mm-per-prompt (vllm/multimodal/processing/context.py), which a
# text-only deployment (image limit 0) answers with HTTP 400.
IMAGE_LIMIT_0 = "At most 0 image(s) may be provided in one prompt."


def refusing(status: int, message: str) -> FakeOpenAI:
    fake = FakeOpenAI()
    fake.routes[("POST", "/v1/chat/completions")] = lambda request: Response(
        status, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status})
    return fake


def test_vllms_zero_image_limit_means_text_only() -> None:
    with refusing(400, IMAGE_LIMIT_0) as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [(r.verdict, r.reason) for r in results] == [
        (SKIPPED, "server is text-only: At most 0 image(s) may be provided in one prompt.")] * 3
    assert results[0].evidence["status"] == 400 and len(fake.requests) == 1


def test_a_long_text_only_refusal_is_quoted_to_160_characters() -> None:
    message = IMAGE_LIMIT_0 + " (parameter=image)" * 10  # 49 + 180 characters
    with refusing(400, message) as fake:
        (first, *_) = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert first.reason == ("server is text-only: At most 0 image(s) may be provided in one prompt. (parameter=image) "
                            "(parameter=image) (parameter=image) (parameter=image) (parameter=image) (parameter=image) "
                            "(p… (+69 chars)")


def test_each_failed_image_scenario_is_named_as_a_vision_result() -> None:
    with refusing(500, "EngineCore encountered an issue") as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [(r.probe, r.scenario, r.verdict) for r in results] == [
        ("vision", "count 3 squares", FAIL), ("vision", "count 5 squares", FAIL), ("vision", "describe color", FAIL)]
    assert results[0].reason == "server error: HTTP 500: EngineCore encountered an issue"


def test_a_long_wrong_answer_is_quoted_to_60_characters() -> None:
    answer = "I see a picture with several shapes in it, some of them squares and some circles."  # 81 characters
    with FakeOpenAI() as fake:
        fake.routes[("POST", "/v1/chat/completions")] = lambda request: Response(200, completion(f"  {answer}  "))
        (first, *_) = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert first.reason == ("answered 'I see a picture with several shapes in it, some of them squa… (+21 chars)', "
                            "expected one of ['3', 'three']")
