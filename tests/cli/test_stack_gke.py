"""`--stack` for a gke stack: credentials into a throwaway kubeconfig, then `kubectl port-forward` to the Service.
gcloud and kubectl are PATH shims: gcloud writes the kubeconfig it is pointed at, kubectl checks it exists and serves
HTTP on the local port it was asked for (127.0.0.1 only); both record their argv and KUBECONFIG."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import requests

from tests.cli.test_stack_resolution import write_executable
from tpuserve.deploy import stack
from tpuserve.serving import ConfigError

GKE_OUTPUTS = {"target": "gke", "project": "my-ml-sandbox", "cluster": "tpu-serve-gke", "clusterLocation": "us-east5",
               "namespace": "tpu-serve", "service": "vllm", "port": 8000,
               "endpoint": "http://vllm.tpu-serve.svc.cluster.local:8000/v1", "model": "google/gemma-4-E2B-it"}

FAKE_GCLOUD = f"""#!{sys.executable}
import json, os, sys
log = os.environ["SHIM_LOG"]
json.dump({{"argv": sys.argv[1:], "kubeconfig": os.environ.get("KUBECONFIG")}}, open(os.path.join(log, "gcloud.json"), "w"))
if os.environ.get("FAKE_GCLOUD_FAIL"):
    sys.exit("ERROR: (gcloud.container.clusters.get-credentials) " + os.environ["FAKE_GCLOUD_FAIL"])
open(os.environ["KUBECONFIG"], "w").write("apiVersion: v1\\nkind: Config\\n")
print("Fetching cluster endpoint and auth data.", file=sys.stderr)
"""

FAKE_KUBECTL = f"""#!{sys.executable}
import json, os, sys
log = os.environ["SHIM_LOG"]
json.dump({{"argv": sys.argv[1:], "kubeconfig": os.environ.get("KUBECONFIG"),
           "kubeconfig_exists": os.path.exists(os.environ.get("KUBECONFIG", ""))}},
          open(os.path.join(log, "kubectl.json"), "w"))
if os.environ.get("FAKE_KUBECTL_FAIL"):
    sys.exit(os.environ["FAKE_KUBECTL_FAIL"])
port = sys.argv[-1].split(":")[0]
os.execv(sys.executable, [sys.executable, "-m", "http.server", port, "--bind", "127.0.0.1", "--directory", log])
"""


@pytest.fixture
def shims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log_dir.mkdir()
    write_executable(bin_dir / "gcloud", FAKE_GCLOUD)
    write_executable(bin_dir / "kubectl", FAKE_KUBECTL)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("SHIM_LOG", str(log_dir))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "users-own-kubeconfig"))
    (log_dir / "marker.txt").write_text("served through the port-forward")
    return log_dir


def recorded(log_dir: Path, tool: str) -> dict:
    return json.loads((log_dir / f"{tool}.json").read_text())


def test_port_forward_reaches_the_service_with_a_private_kubeconfig(shims: Path, tmp_path: Path) -> None:
    with stack.endpoint_for(GKE_OUTPUTS) as endpoint:
        assert endpoint.startswith("http://localhost:") and endpoint.endswith("/v1")
        port = int(endpoint.split(":")[2].split("/")[0])
        assert requests.get(f"http://127.0.0.1:{port}/marker.txt", timeout=5).text == \
            "served through the port-forward"
        gcloud, kubectl = recorded(shims, "gcloud"), recorded(shims, "kubectl")
    assert gcloud["argv"] == ["container", "clusters", "get-credentials", "tpu-serve-gke", "--location", "us-east5",
                              "--project", "my-ml-sandbox"]
    assert kubectl["argv"] == ["port-forward", "--namespace", "tpu-serve", "--address", "127.0.0.1",
                               "service/vllm", f"{port}:8000"]
    assert kubectl["kubeconfig"] == gcloud["kubeconfig"] and kubectl["kubeconfig_exists"]
    assert gcloud["kubeconfig"] != os.environ["KUBECONFIG"]
    assert not (tmp_path / "users-own-kubeconfig").exists()
    assert not Path(gcloud["kubeconfig"]).exists()  # the throwaway kubeconfig is gone with the block


def test_port_forward_ends_with_the_block(shims: Path) -> None:
    with stack.endpoint_for(GKE_OUTPUTS) as endpoint:
        port = int(endpoint.split(":")[2].split("/")[0])
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/marker.txt", timeout=2)


def test_credentials_failure_says_what_gcloud_said(shims: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_FAIL", "ResponseError: code=404, message=Not found: projects/my-ml-sandbox/"
                                           "locations/us-east5/clusters/tpu-serve-gke.")
    with pytest.raises(stack.TunnelError, match=r"get-credentials exited with 1: .*code=404, message=Not found"):
        with stack.endpoint_for(GKE_OUTPUTS):
            pass
    assert not (shims / "kubectl.json").exists()


def test_port_forward_failure_says_what_kubectl_said(shims: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KUBECTL_FAIL", 'error: services "vllm" not found')
    with pytest.raises(stack.TunnelError, match=r'service/vllm exited with 1: error: services "vllm" not found'):
        with stack.endpoint_for(GKE_OUTPUTS):
            pass


def test_missing_kubectl_is_a_config_error(shims: Path) -> None:
    (shims.parent / "bin" / "kubectl").unlink()
    with pytest.raises(ConfigError, match="needs gcloud and kubectl"):
        with stack.endpoint_for(GKE_OUTPUTS):
            pass


def test_served_endpoint_uses_the_stack_model(shims: Path) -> None:
    # what the port-forwarded vLLM lists (the stack's model among others; the shim serves files)
    (shims / "v1").mkdir()
    (shims / "v1" / "models").write_text(json.dumps({"object": "list", "data": [
        {"id": "other/model", "object": "model"}, {"id": "google/gemma-4-E2B-it", "object": "model"}]}))
    with stack.served_endpoint(None, None, GKE_OUTPUTS) as served:
        assert served.url.startswith("http://localhost:") and served.model == "google/gemma-4-E2B-it"


def test_gate_with_a_gke_stack_says_how_to_check_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tpuserve.observe.gate import gate

    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**GKE_OUTPUTS, "portForwardCommand": "kubectl port-forward --namespace tpu-serve "
                                                                        "service/vllm 8000:8000"}))
    result = CliRunner().invoke(gate, ["--stack-outputs", str(outputs)])
    assert result.exit_code == 2
    assert ("stack runs on GKE, whose readiness is its pods' probe: run `kubectl port-forward --namespace tpu-serve "
            "service/vllm 8000:8000`, then gate --url http://localhost:8000 --model google/gemma-4-E2B-it") in \
        " ".join(result.output.split())
