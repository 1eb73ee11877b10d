"""vm/compile_cache.py against the sandbox's fake Cloud Storage (tests/vm_sandbox.FakeGoogle: objects list with
nextPageToken paging, media download, media upload with a 412 for a failed `ifGenerationMatch=0`): restore never
clobbers a local entry and takes only its own key, push never overwrites an object, and only whole entries count."""

from __future__ import annotations

import pytest

from tests.fakes.vm_sandbox import ACCESS_TOKEN, BUCKET, FakeGoogle, Knobs
from vm import compile_cache

KEY = "abababababababab-ct6e-standard-1t"


@pytest.fixture
def google(tmp_path):
    fake = FakeGoogle(tmp_path / "state", Knobs())
    with fake.server:
        yield fake


def token() -> str:
    return ACCESS_TOKEN


def test_entries_count_compiled_programs_not_their_atime_files(tmp_path):
    assert compile_cache.entries(tmp_path / "absent") == 0
    for name in ("jit_a-cache", "jit_a-atime", "jit_b-cache", "sub/jit_c-cache"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert compile_cache.entries(tmp_path) == 3


def test_restore_takes_only_its_key_and_never_clobbers_a_local_entry(google, tmp_path):
    google.objects = {f"xla/{KEY}/jit_a-cache": b"bucket a", f"xla/{KEY}/jit_b-cache": b"bucket b",
                      f"xla/{KEY}/sub/jit_c-cache": b"bucket c", "xla/other-key/jit_d-cache": b"another image's",
                      f"xla/{KEY}x/jit_e-cache": b"a key that starts the same"}
    local = tmp_path / "xla"
    local.mkdir()
    (local / "jit_a-cache").write_bytes(b"local a")
    assert compile_cache.restore(BUCKET, KEY, local, token, google.server.url) == 2
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()} == {
        "jit_a-cache": b"local a", "jit_b-cache": b"bucket b", "sub/jit_c-cache": b"bucket c"}


def test_restore_follows_every_page_of_the_listing(google, tmp_path):
    google.knobs.page_size = 2
    google.objects = {f"xla/{KEY}/jit_{n}-cache": b"c" for n in range(5)}
    assert compile_cache.restore(BUCKET, KEY, tmp_path, token, google.server.url) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"jit_{n}-cache" for n in range(5)]
    listings = [r for r in google.server.requests if r.path == f"/storage/v1/b/{BUCKET}/o"]
    assert len(listings) == 3


def test_a_failed_download_raises_and_writes_nothing(google, tmp_path, monkeypatch):
    google.objects = {f"xla/{KEY}/jit_a-cache": b"a"}
    listed = compile_cache.remote_names
    # An object deleted between the listing and its download: the download answers 404.
    monkeypatch.setattr(compile_cache, "remote_names", lambda *a: [*listed(*a), f"xla/{KEY}/jit_gone-cache"])
    with pytest.raises(compile_cache.CacheError, match=f"downloading gs://{BUCKET}/xla/{KEY}/jit_gone-cache "
                                                       "answered HTTP 404"):
        compile_cache.restore(BUCKET, KEY, tmp_path, token, google.server.url)
    assert not (tmp_path / "jit_gone-cache").exists()


def test_push_uploads_only_whole_new_entries_and_never_overwrites(google, tmp_path):
    google.objects = {f"xla/{KEY}/jit_a-cache": b"bucket a"}
    for name, text in (("jit_a-cache", "local a"), ("jit_b-cache", "b"), ("jit_c-cache.partial", "half")):
        (tmp_path / name).write_text(text)
    assert compile_cache.push(BUCKET, KEY, tmp_path, token, google.server.url) == 1
    assert google.objects == {f"xla/{KEY}/jit_a-cache": b"bucket a", f"xla/{KEY}/jit_b-cache": b"b"}
    uploads = [r for r in google.server.requests if r.path.startswith("/upload/")]
    assert len(uploads) == 1 and "ifGenerationMatch=0" in uploads[0].query


def test_push_counts_an_entry_another_vm_created_first_as_not_created(google, tmp_path, monkeypatch):
    google.objects = {f"xla/{KEY}/jit_a-cache": b"the other VM's"}
    monkeypatch.setattr(compile_cache, "remote_names", lambda *a: [])  # listed before the other VM's upload
    for name in ("jit_a-cache", "jit_b-cache"):
        (tmp_path / name).write_text("mine")
    assert compile_cache.push(BUCKET, KEY, tmp_path, token, google.server.url) == 1
    assert google.objects[f"xla/{KEY}/jit_a-cache"] == b"the other VM's"
