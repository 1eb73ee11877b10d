"""Fake `gcloud` and `kubectl` that really tunnel: what `--stack` runs to reach a gcp or gke deployment
(tpuserve/deploy/stack.py), with the far end a test server on 127.0.0.1.

- `gcloud compute start-iap-tunnel VM PORT --local-host-port=localhost:LOCAL ...` listens on 127.0.0.1:LOCAL
- `gcloud container clusters get-credentials ...` writes a kubeconfig where $KUBECONFIG says, as gcloud does
- `kubectl port-forward ... service/NAME LOCAL:PORT` listens on 127.0.0.1:LOCAL
Both listeners forward every connection byte for byte to $FAKE_TUNNEL_TARGET (host:port) until terminated, as the
real tunnel forwards to the VM's or the Service's port. Every call is logged, one line each, in $FAKE_TUNNEL_LOG.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

PROGRAM = f"""#!{sys.executable}
import os, socket, sys, threading

name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["FAKE_TUNNEL_LOG"], "a") as log:
    log.write(" ".join([name, *args]) + "\\n")
if name == "gcloud" and args[:3] == ["container", "clusters", "get-credentials"]:
    with open(os.environ["KUBECONFIG"], "w") as config:
        config.write("apiVersion: v1\\nkind: Config\\n")
    sys.exit(0)
if name == "gcloud" and args[:2] == ["compute", "start-iap-tunnel"]:
    port = int(next(a for a in args if a.startswith("--local-host-port=")).rsplit(":", 1)[1])
elif name == "kubectl" and args[:1] == ["port-forward"]:
    port = int(args[-1].split(":")[0])
else:
    sys.exit(f"fake {{name}}: not a call tpuserve makes: {{args}}")
host, target_port = os.environ["FAKE_TUNNEL_TARGET"].rsplit(":", 1)


def pipe(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


listener = socket.create_server(("127.0.0.1", port))
while True:
    client, _ = listener.accept()
    upstream = socket.create_connection((host, int(target_port)))
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
"""


def install(bin_dir: Path) -> None:
    """Write `gcloud` and `kubectl` into `bin_dir`; set FAKE_TUNNEL_TARGET and FAKE_TUNNEL_LOG in the environment."""
    bin_dir.mkdir(exist_ok=True)
    for name in ("gcloud", "kubectl"):
        path = bin_dir / name
        path.write_text(PROGRAM)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
