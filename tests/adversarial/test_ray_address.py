"""Ray addresses where no cluster answers (issue 18, item 12): ``ray.init`` there retries for
minutes, a warning every 5 s, and a garbage address used to end in "internal error" after a while,
leaving the experiment queued or the tune running.  Each is a user error: exit 2 with one line
before anything is stored, within the probe's bounded time (:func:`check_ray_address`).

Whole ``kvlab run`` / ``kvlab tune`` processes against a real closed port, a real TCP listener that
never answers, and malformed addresses; no Ray cluster is needed (tests/experiments/test_ray_executor.py runs
a real one, where the probe must let a good address through).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvlab.experiments.ray_executor import CONNECT_TIMEOUT_S  # does not import Ray
from kvlab.store import Store
from tests.waiting import SAFETY_S

# Found, not imported: Ray reads its auth settings when first imported, and tests/experiments/test_ray_executor.py
# sets them for its token-auth cluster before its import; an import here, earlier in the same pytest
# run, left that test's driver without the token, and its connection to the cluster hung.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray (kvlab[ray]) is not installed: scripts/setup.sh --dev installs it")

ROOT = Path(__file__).resolve().parents[2]
KVLAB = [sys.executable, "-m", "kvlab.cli"]


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A port on this machine where nothing listens (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word (a firewall's tarpit, a wrong service)."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(64)  # the kernel completes the handshakes; nobody ever reads or writes
        yield listener.getsockname()[1]


def _kvlab(args: list[str], tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, float, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    environment = {**os.environ, "KVLAB_DATABASE_URL": url, **env}
    started = time.monotonic()
    done = subprocess.run([*KVLAB, *args], env=environment, cwd=ROOT, capture_output=True, text=True,
                          timeout=SAFETY_S)
    return done, time.monotonic() - started, url


def _refused(done: subprocess.CompletedProcess, url: str, starts: str) -> str:
    """Exit 2, one error line starting ``starts``, no result, nothing stored; the line."""
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(starts), done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr  # none of Ray's "Failed to connect" lines
    with Store(url) as store:
        assert store.list_experiments() == []
    return errors[0]


def test_kvlab_run_on_a_closed_port_is_refused_at_once(closed_port, tmp_path):
    done, _, url = _kvlab(["run", "examples/tiny.toml", "--executor", "ray", "--ray-address",
                           f"127.0.0.1:{closed_port}"], tmp_path)
    line = _refused(done, url, f"error: --ray-address '127.0.0.1:{closed_port}': cannot connect to ")
    assert "Connection refused" in line and "ray start --head" in line


@pytest.mark.server
def test_kvlab_run_on_a_port_that_never_answers_is_refused_within_the_probe_timeout(closed_port, silent_port,
                                                                                     tmp_path):
    """Bounded: the silent address costs at most the probe's two timeouts more than a refused one
    (which measures this machine's start-up and `import ray`, whatever its load)."""
    refused, refused_s, _ = _kvlab(["run", "examples/tiny.toml", "--executor", "ray", "--ray-address",
                                    f"127.0.0.1:{closed_port}"], tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr
    for address in (f"127.0.0.1:{silent_port}", f"ray://127.0.0.1:{silent_port}"):
        done, took_s, url = _kvlab(["run", "examples/tiny.toml", "--executor", "ray", "--ray-address", address],
                                   tmp_path / address.replace("/", "_").replace(":", "_"))
        line = _refused(done, url, f"error: --ray-address '{address}': ")
        assert f"accepts connections but does not answer as a Ray {'head' if '//' not in address else 'Client'}" in line
        assert took_s < 2 * refused_s + 2 * CONNECT_TIMEOUT_S, (took_s, refused_s)


@pytest.mark.parametrize("address", ["garbage address", "http://127.0.0.1:6379", "127.0.0.1:99999", "127.0.0.1",
                                     "ray://", "ray://host name:10001", ":6379"])
def test_kvlab_run_on_a_malformed_address_is_refused_naming_the_forms(address, tmp_path):
    done, _, url = _kvlab(["run", "examples/tiny.toml", "--executor", "ray", "--ray-address", address], tmp_path)
    _refused(done, url, f"error: --ray-address {address!r}: not a Ray address; give auto, local, HOST:PORT")


def test_a_bad_ray_address_in_the_environment_is_named_as_such(tmp_path):
    done, _, url = _kvlab(["run", "examples/tiny.toml", "--executor", "ray"], tmp_path, RAY_ADDRESS="not an address")
    _refused(done, url, "error: RAY_ADDRESS 'not an address': not a Ray address")


def test_kvlab_tune_on_a_closed_port_stores_no_tune(closed_port, tmp_path):
    done, _, url = _kvlab(["tune", "examples/tune.toml", "--executor", "ray", "--ray-address",
                           f"ray://127.0.0.1:{closed_port}"], tmp_path)
    _refused(done, url, f"error: --ray-address 'ray://127.0.0.1:{closed_port}': cannot connect to ")


@pytest.mark.parametrize("address, message", [
    ("nonexistent.invalid:6379", "the host 'nonexistent.invalid' is not known here"),
    ("[::1]:notaport", "not a Ray address"),
    ("ray://[::1]", "cannot connect to [::1]:10001"),
])
def test_the_check_names_what_is_wrong(address, message):
    said = _check_in_a_process(address)
    assert re.search(f"^{re.escape(f'--ray-address {address!r}: ')}.*{re.escape(message)}", said), said


def test_local_starts_a_cluster_so_it_is_not_probed():
    assert _check_in_a_process("local") == "ok"  # nothing to connect to: ray.init starts one


def _check_in_a_process(address: str) -> str:
    """check_ray_address in a process of its own: what it raised, or "ok".  Not in the test process:
    Ray's and gRPC's process-wide state after a failed probe kept the two-node cluster of
    tests/experiments/test_ray_executor.py from connecting later in the same pytest run."""
    code = ("import sys\nfrom kvlab.core.errors import ConfigError\n"
            "from kvlab.experiments.ray_executor import check_ray_address\n"
            "try:\n    check_ray_address(sys.argv[1])\nexcept ConfigError as error:\n    print(error)\n"
            "else:\n    print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, cwd=ROOT,
                          timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
