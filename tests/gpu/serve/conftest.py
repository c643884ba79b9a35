"""make test-serve: the patched SGLang server with EAGLE-3 on generated tiny models (tiny_models.py).

  pytest tests/gpu/serve [--serve-out FILE|DIR] [--serve-world N] [--serve-port BASE] [--standins]

Every phase's server (_servers.PHASES) starts at once at TP N (default: the largest of 1, 2, 4, 8 GPUs visible);
all are stopped at the end, and a process left or a port held fails the session. --standins: the lent-GPU route.
Without a CUDA GPU the server tests skip with the reason (with --serve-out, pytest exits 2). The result (make
report's) is pytest's junitxml, --serve-out FILE or DIR/test-serve_<box>_<stamp>.xml: each test's `detail`, the
run's properties (properties()), no path of this machine; the servers' logs beside it (.log).
"""

import concurrent.futures as cf
import contextlib
import importlib.util
import io
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

import _servers as sv
from scripts.box.results import finish_junit, result_file

RUN: dict = {"servers": {}, "world": 0, "gpus": [], "t0": None, "refused": ""}


def pytest_addoption(parser):
    g = parser.getgroup("test-serve")
    g.addoption("--serve-out", type=Path, help="the result (junitxml): a FILE, or a DIR for its default name")
    g.addoption("--serve-world", type=int, help="tensor-parallel size of every server")
    g.addoption("--serve-port", type=int, default=31000, help="first HTTP port (phase i: BASE + 10 i)")
    g.addoption("--standins", action="store_true", help="the lent-GPU route: stand-ins for what cannot load")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    """Both tiny pairs, generated once (seconds)."""
    from tiny_models import PAIRS, write_pair

    out = tmp_path_factory.mktemp("tiny-models")
    for pair in PAIRS:
        write_pair(out, pair)
    return out


def why_not(standins: bool) -> str:
    import torch

    if not torch.cuda.is_available():
        return (
            "test-serve starts servers on a CUDA GPU and torch sees none here: run `make test-serve` on the box, "
            "or `pytest tests/gpu/serve` on a machine with a GPU and the patched SGLang"
        )
    try:
        import sglang.test.test_utils  # noqa: F401
    except Exception as e:  # noqa: BLE001 - said as the reason
        return f"cannot import sglang.test.test_utils ({e}): install the patched SGLang or put its tree on PYTHONPATH"
    if not standins and importlib.util.find_spec("sgl_kernel") is None:
        return "sgl_kernel cannot be imported, so no server can start: on a lent GPU machine add --standins"
    if not shutil.which("sglang"):  # popen_launch_server runs `sglang serve`
        return "no `sglang` command on PATH: install the patched SGLang (a tree on PYTHONPATH has no console script)"
    return ""


def pytest_collection_finish(session):
    """With --serve-out, a machine that cannot start a server is one refusal, not a hundred failed tests."""
    why = session.config.getoption("--serve-out") and why_not(session.config.getoption("--standins"))
    if why:
        RUN["refused"] = why
        pytest.exit(why, returncode=2)


@pytest.fixture(scope="session")
def server(request, tmp_path_factory):
    """server(phase) -> its running _servers.Server; all start at once on first use, end checked gone, ports free."""
    opt = request.config.getoption
    why = why_not(opt("--standins"))
    if why:
        pytest.fail(why, pytrace=False) if opt("--serve-out") else pytest.skip(why)
    import torch

    tiny_models, gpus = request.getfixturevalue("tiny_models"), torch.cuda.device_count()
    world = opt("--serve-world") or max(n for n in (1, 2, 4, 8) if n <= gpus)
    work = tmp_path_factory.mktemp("servers")
    flags = sv.LENT_FLAGS if opt("--standins") else ()
    servers = {
        n: sv.Server.plan(p, i, opt("--serve-port"), world, tiny_models, flags, work)
        for i, (n, p) in enumerate(sv.PHASES.items())
    }
    from sglang.srt.utils.network import is_port_available

    if world > gpus:
        pytest.fail(f"--serve-world {world}, but {gpus} GPU(s) are visible")
    busy = [s.port for s in servers.values() if not is_port_available(s.port)]
    if busy:
        pytest.fail(f"port(s) {busy} in use: stop what listens there or pass --serve-port BASE")
    env, kept = sv.server_env(opt("--standins"))
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    RUN.update(servers=servers, world=world, kept=kept, tmp=tmp_path_factory.getbasetemp(), gpus=names)
    RUN["t0"] = time.monotonic()
    guard = {"EAGLE_SYNC_GUARD": str(work / sv.GUARD_FILE)}
    with contextlib.redirect_stdout(io.StringIO()), cf.ThreadPoolExecutor(len(servers)) as ex:  # it tees the logs
        list(ex.map(lambda s: s.start({**env, **(guard if s.phase.name == sv.GUARDED else {})}), servers.values()))

    def get(name: str) -> sv.Server:
        assert not servers[name].error, servers[name].error
        return servers[name]

    yield get
    with cf.ThreadPoolExecutor(len(servers)) as ex:
        stops = dict(zip(servers, ex.map(lambda s: s.stop(), servers.values())))
    for name, st in stops.items():
        servers[name].report["stop"] = st
    assert all(not st["left"] and st["port_free"] for st in stops.values()), f"servers not stopped cleanly: {stops}"


@pytest.hookimpl(tryfirst=True)  # before junitxml's: --serve-out names its file
def pytest_configure(config):
    out = config.getoption("--serve-out", None)
    if out is not None and not config.option.xmlpath:
        config.option.xmlpath = str(result_file("test-serve", ".xml", directory=out) if out.is_dir() else out)


@pytest.hookimpl(trylast=True)  # after pytest's own teardown and junitxml's file (an interrupted run still has both)
def pytest_sessionfinish(session):
    out = Path(session.config.option.xmlpath or "")
    if not out.is_file():
        return
    places = {Path.home(): "~", sys.prefix: "<python>", sv.HERE.parents[2]: "<repo>", out.parent.resolve(): "<results>"}
    masks = {str(p): m for p, m in {**places, RUN.get("tmp"): "<tmp>"}.items() if p}
    finish_junit(out, properties(session.config), masks)
    logs = "".join(
        f"===== {n}: {' '.join(s.command)}\n{s.log.read_text(errors='replace') if s.log.is_file() else ''}"
        for n, s in RUN["servers"].items()
    )
    for path in sorted(masks, key=len, reverse=True):  # no path of the machine that ran it
        logs = logs.replace(path, masks[path])
    out.with_suffix(".log").write_text(logs)
    session.config.get_terminal_writer().line(f"test-serve result: {out}")


def properties(config) -> dict:
    """The run's: world, GPUs, the command, versions, the route, a refusal, what each server reported."""
    from scripts.lib.repo import revision

    standins = config.getoption("--standins")
    modules = ("torch", "triton", "transformers", "sglang")
    versions = {m: getattr(sys.modules.get(m), "__version__", None) for m in modules}
    versions["patchset"] = os.environ.get("EAGLE_PATCHSET")  # the image's; a tree's from git (contract 8):
    with contextlib.suppress(Exception):
        from scripts.series.pin import applied_patchset

        versions["patchset"] = versions["patchset"] or applied_patchset(Path(sys.modules["sglang"].__file__).parent)
    doc = {
        "world": RUN["world"],
        "gpus": RUN["gpus"],
        "route": "lent-gpu" if standins else "box",
        "command": " ".join(["python3", "-m", "pytest", *config.invocation_params.args]),
        "revision": revision(short=True)[0],
        "seconds": round(time.monotonic() - RUN["t0"]) if RUN["t0"] else 0,
        "versions": versions,
        "refused": RUN["refused"],
        "phases": {
            n: {"command": " ".join(s.command), "error": s.error, **s.report} for n, s in RUN["servers"].items()
        },
        "route_env": sv.LENT_ENV if standins else {},
        "kept_env": RUN.get("kept", {}),
        "proxy": None,
    }
    if standins and RUN["gpus"]:
        doc["proxy"] = (
            f"proxy: torch {versions['torch']}, stand-ins sgl_kernel, flash_mla, "
            f"{' '.join(sv.LENT_FLAGS)}; {RUN['gpus'][0]} x{RUN['world']} at TP{RUN['world']}, not the "
            f"box's SM120 GPUs, kernels or collectives"
        )
    return doc
