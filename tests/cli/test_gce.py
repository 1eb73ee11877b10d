"""tpuserve.gce against a fake Compute API (tests/httpfake.FakeServer on 127.0.0.1): recorded response shapes."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest
import requests

from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve import gce
from tpuserve.gce import ComputeApiError, ComputeClient, Instance

VM = Instance("demo-project", "us-east5-b", "tpu-serve-vm")
VM_PATH = "/compute/v1/projects/demo-project/zones/us-east5-b/instances/tpu-serve-vm"


def guest_attributes_body(items: list[tuple[str, str, str]]) -> dict:
    return {"kind": "compute#guestAttributes", "queryPath": "tpu-serve/", "queryValue": {
        "items": [{"namespace": namespace, "key": key, "value": value} for namespace, key, value in items]}}


def client(fake: FakeServer) -> ComputeClient:
    return ComputeClient(requests.Session(), fake.url)


def test_guest_attributes_reads_one_namespace_through_the_query_path():
    body = guest_attributes_body([("tpu-serve", "stage", "pulling-image"), ("tpu-serve", "at-pulling-image", "17"),
                                  ("other", "stage", "ignored")])
    with FakeServer({("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: Response(200, body)}) as fake:
        attributes = client(fake).guest_attributes(VM, "tpu-serve")
    assert attributes == {"stage": "pulling-image", "at-pulling-image": "17"}
    assert parse_qs(fake.requests[0].query) == {"queryPath": ["tpu-serve/"]}


def test_no_guest_attributes_yet_is_an_empty_mapping_not_an_error():
    with FakeServer({("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: Response(
            404, {"error": {"code": 404, "message": "The resource was not found"}})}) as fake:
        assert client(fake).guest_attributes(VM, "tpu-serve") == {}


def test_an_api_error_carries_the_status_and_googles_message():
    denied = Response(403, {"error": {"code": 403, "message": "Required 'compute.instances.getGuestAttributes'"}})
    with FakeServer({("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: denied}) as fake, \
            pytest.raises(ComputeApiError, match="compute.instances.getGuestAttributes") as raised:
        client(fake).guest_attributes(VM, "tpu-serve")
    assert raised.value.status == 403


def test_instance_reads_the_instance_resource():
    body = {"kind": "compute#instance", "name": VM.name, "status": "TERMINATED"}
    with FakeServer({("GET", VM_PATH): lambda request: Response(200, body)}) as fake:
        assert client(fake).instance(VM)["status"] == "TERMINATED"
    assert [(r.method, r.path) for r in fake.requests] == [("GET", VM_PATH)]


def test_a_deleted_instance_raises_with_status_404():
    gone = Response(404, {"error": {"code": 404, "message": f"The resource '{VM_PATH}' was not found"}})
    with FakeServer({("GET", VM_PATH): lambda request: gone}) as fake, \
            pytest.raises(ComputeApiError, match="was not found") as raised:
        client(fake).instance(VM)
    assert raised.value.status == 404


def test_serial_output_reads_port_one():
    def serial(request: Request) -> Response:
        return Response(200, {"kind": "compute#serialPortOutput", "contents": "boot\nready\n", "next": "11"})

    with FakeServer({("GET", f"{VM_PATH}/serialPort"): serial}) as fake:
        assert client(fake).serial_output(VM) == "boot\nready\n"
    assert parse_qs(fake.requests[0].query) == {"port": ["1"]}


def test_adc_session_asks_for_the_cloud_platform_scope(monkeypatch: pytest.MonkeyPatch):
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    asked: list[list[str]] = []

    def fake_default(scopes: list[str]) -> tuple[AnonymousCredentials, str]:
        asked.append(scopes)
        return AnonymousCredentials(), "demo-project"

    monkeypatch.setattr(google.auth, "default", fake_default)
    session = gce.adc_session()
    assert asked == [[gce.CLOUD_PLATFORM_SCOPE]]
    assert isinstance(session.credentials, AnonymousCredentials)


def test_missing_credentials_say_how_to_log_in(monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_credentials(**kwargs):
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    with pytest.raises(gce.MissingCredentials, match="gcloud auth application-default login"):
        gce.adc_session()
