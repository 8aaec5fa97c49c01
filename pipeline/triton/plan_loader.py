"""Plans that cannot take the server down: loaded after it starts, one at a time (``build --plans-at-deploy``).

A TensorRT plan deserializes only on the TensorRT that built it, and images of the same month need not carry the same
one: Triton issue #5975 ("The engine plan file is not compatible with this version of TensorRT, expecting library
version 8.6.1.2 got 8.6.1.6", tritonserver vs tensorrt 23.05). Loaded at start under ``--exit-on-error=true``, one
such plan stopped the server, and ``restart: unless-stopped`` looped it with every model down. So the bundle's
server starts with the ONNX variants and every other model (explicit model control, one ``--load-model`` each),
and :data:`LOADER`, in the server's own container (whose TensorRT is the one that matters), waits until it is ready
and then loads each plan the init step built through the repository API (``POST /v2/repository/models/<plan>/load``,
with the admin key). A plan that does not load is said in one line and left out; the server and its other models
serve on. The server's process stays the container's: the loader runs beside it, and a stop signal is passed on.

The init step's Polygraphy comes from the TensorRT container when it has one, else from :data:`WHEEL_DIR` in the
bundle: the wheel of the Polygraphy this pipeline runs, rebuilt from its installed files (pure Python), so no step
of a deploy needs a network.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path

LOADER = "load-plans.py"  # in the bundle, mounted into the server's container at /load-plans.py
WHEEL_DIR = "wheels"  # in the bundle, mounted into the TensorRT container at /wheels

LOADER_SOURCE = '''#!/usr/bin/env python3
"""Load each TensorRT plan of PLANS_DIR (argument 1, default /plans) into the running Triton, after it is ready: a plan
that does not load is said in one line and the other models serve on. Written by the pipeline (stdlib only)."""
import json
import os
import sys
import time
import urllib.error
import urllib.request

plans = sys.argv[1] if len(sys.argv) > 1 else "/plans"
url = (sys.argv[2] if len(sys.argv) > 2 else os.environ.get("TRITON_URL", "http://127.0.0.1:8000")).rstrip("/")
key = os.environ.get("TRITON_ADMIN_KEY", "")
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the server is local: never through a proxy
deadline = time.monotonic() + float(os.environ.get("PLANS_WAIT_S", "1800"))
while True:
    try:
        direct.open(url + "/v2/health/ready", timeout=5).close()
        break
    except (urllib.error.URLError, OSError):
        if time.monotonic() > deadline:
            print("plans not loaded: the server did not become ready")
            sys.exit(0)
        time.sleep(2)
names = sorted(d for d in os.listdir(plans) if not d.startswith(".") and os.path.isdir(os.path.join(plans, d))) if os.path.isdir(plans) else []
failed = 0
for name in names:
    request = urllib.request.Request(url + "/v2/repository/models/" + name + "/load", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json", **({"admin-key": key} if key else {})})
    try:
        direct.open(request, timeout=float(os.environ.get("PLAN_LOAD_TIMEOUT_S", "1800"))).close()
        print("plan " + name + ": loaded")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            why = json.loads(body).get("error", "")
        except ValueError:
            why = body.decode(errors="replace")
        first = (why or str(exc)).strip().splitlines()[0] if (why or str(exc)).strip() else str(exc)
        print("plan " + name + ": not loaded, the other models serve on: " + first)
        failed += 1
    except (urllib.error.URLError, OSError) as exc:
        print("plan " + name + ": not loaded, the server did not answer: " + str(exc))
        failed += 1
if names:
    print(str(len(names) - failed) + " of " + str(len(names)) + " plans loaded")
'''


def serve_then_load(server_command: str, http_port: int, loader: str = f"/{LOADER}", plans_dir: str = "/plans") -> str:
    """The container's shell: the server and the loader (told the server's HTTP port) both in the background, then the
    server waited on, so the container lives and dies with the server and a stop signal reaches it at once, whatever
    the loader is doing."""
    # One group: after ``setup && `` only the server goes to the background, so $! is the server itself (without the
    # braces the whole and-list ran in a subshell, which took the TERM and left the server running). The shell waits
    # only on the server (a trap runs during a wait, not during a foreground command); a signal interrupts that wait,
    # and the server, signalled in turn, is waited on again for its own exit status.
    return (f"{{ {server_command} & pid=$!; trap 'kill -TERM \"$pid\"' TERM INT; "
            f"{{ python3 {loader} {plans_dir} http://127.0.0.1:{http_port} || true; }} & "
            f"wait \"$pid\"; status=$?; if kill -0 \"$pid\" 2>/dev/null; then wait \"$pid\"; status=$?; fi; exit \"$status\"; }}")


def polygraphy_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a wheel of the installed Polygraphy, rebuilt from its files and its own ``WHEEL`` tags
    (pure Python; ``RECORD`` written anew; the console script comes back from ``entry_points.txt`` when pip installs it)."""
    dist = metadata.distribution("polygraphy")
    name, version = dist.metadata["Name"], dist.version
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")] or ["py3-none-any"]
    pythons = ".".join(sorted({t.split("-")[0] for t in tags}))
    filename = f"{name.replace('-', '_')}-{version}-{pythons}-none-any.whl"
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    skipped = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}
    buffer, rows = io.BytesIO(), []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file in sorted(dist.files or [], key=str):
            relative = str(file)
            if relative.startswith("..") or "__pycache__" in relative or relative.endswith(".pyc") or Path(relative).name in skipped:
                continue
            data = Path(str(dist.locate_file(file))).read_bytes()
            info = zipfile.ZipInfo(relative, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible: the same wheel every time
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((relative, f"sha256={digest}", str(len(data))))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows([*rows, (f"{dist_info}/RECORD", "", "")])
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        wheel.writestr(info, record.getvalue())
    return filename, buffer.getvalue()
