"""`make bench` through its real entry points: the counters a server reports, the plan, the dry run, the checks before
the first server, and both server routes (the box's containers, --server-url) end to end against stand-in servers
(tests/fixtures/bench/standin_server.py; record_fixtures.py records its outputs), with SGLang's real bench_serving
run as the image's bench-client verb."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import _fake_docker
from scripts.bench import bench, observe
from scripts.bench import plan as pl
from scripts.bench import report as rep
from scripts.box.ranks import free_port
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin, patchset_id

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "bench"
TREE = ROOT / "build" / "sglang" / "python"
sys.path.insert(0, str(FIX))
import standin_server  # noqa: E402

IMAGE = load_pin().serving_image


def bench_verb(*args) -> subprocess.CompletedProcess:
    return _fake_docker.verb("scripts.bench.bench", *args)


def client_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(TREE)}


@pytest.fixture
def box(tmp_path, monkeypatch) -> dict:
    """A fake box: docker whose serve is a stand-in, 8 idle GPUs, a model and a drafter, variants, one scenario."""
    # EXIT: the server dies while starting; MUTE: the container runs, nothing answers; ANOTHER: another server answers
    standin = FIX / "standin_server.py"
    serve = f'[ "$EXIT" ] && exit 1; [ "$MUTE" ] && exec sleep 600; exec python3 {standin} "$@" ${{ANOTHER:+--model 1}}'
    docker = _fake_docker.install(tmp_path, (IMAGE,), pythonpath=(TREE,), verbs={"serve": serve}, gpus=8)
    for d in ("model", "draft"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text("{}")
    variants, scenarios = tmp_path / "variants.toml", tmp_path / "scenarios.toml"
    variants.write_text(
        f'[defaults]\nmodel = "{tmp_path}/model"\ndraft_model = "{tmp_path}/draft"\n'
        f'port = {free_port()}\n[[variant]]\nname = "nospec"\nprofile = "kimi-k25-tp8"\n'
        '[[variant]]\nname = "eagle3"\nprofile = "kimi-k25-eagle3-tp8"\nspeculative = true\n'
        + "".join(
            f'[[variant]]\nname = "{v.lower()}"\nprofile = "kimi-k25-tp8"\nenv = {{ {v} = "1" }}\ndefault = false\n'
            for v in ("EXIT", "MUTE", "ANOTHER")
        )
    )
    scenarios.write_text(
        '[defaults]\ninput_len = 32\noutput_len = 48\n[[scenario]]\nname = "C2"\nmax_concurrency = 2\nnum_prompts = 8\n'
    )
    for k, v in client_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", f"{docker.bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    res = tmp_path / "results"
    args = f"--variants-file {variants} --scenarios-file {scenarios} --results-dir {res} --repeats 1 --box b "
    args += f"--tokenizer {FIX / 'tokenizer'} --sample-interval 0.05"
    return {"docker": docker, "res": res, "args": args.split(), "tmp": tmp_path}


def snap(info=None, metrics=None) -> observe.Snapshot:
    return observe.Snapshot(0.0, info, observe.parse_metrics(metrics) if metrics is not None else None)


def test_the_counters_read_from_a_recorded_patched_and_stock_server():
    """/server_info and /metrics give the same counts per speculative stage; upstream's decode series and stock none."""
    info = json.loads((FIX / "server_info_patched.json").read_text())
    metrics = observe.parse_metrics((FIX / "metrics_patched.txt").read_text())
    from_info = observe.graph_counts_from_info(info)
    assert set(from_info) == set(observe.STAGES) - {"draft_block"}  # an EAGLE-3 server's stages
    assert from_info == observe.graph_counts_from_metrics(metrics)
    assert from_info["target_verify"]["eager"] == sum(from_info["target_verify"]["fallback_reasons"].values()) > 0
    d = observe.graph_delta(snap(), snap(info, (FIX / "metrics_patched.txt").read_text()))
    assert d["source"] == "metrics" and d["hit_rate"] == pytest.approx(d["graph"] / (d["graph"] + d["eager"]))
    stock = (FIX / "metrics_stock.txt").read_text()
    assert observe.graph_delta(snap(), snap(json.loads((FIX / "server_info_stock.json").read_text()), stock)) is None
    assert observe.spec_collectives(info) is None  # recorded only with SGLANG_RECORD_SPEC_COLLECTIVES=1
    with_coll = {"internal_states": [{"spec_collectives": {"target_verify": {"graphs": 1, "calls": {}}}}]}
    assert observe.spec_collectives(with_coll) == {"target_verify": {"graphs": 1, "calls": {}}}


def _metrics(graph: int, eager: dict, gen: float = 0, calls: float = 0) -> str:
    m = 'sglang:cuda_graph_passes_total{tp_rank="0",mode="x",stage='
    lines = [f'{m}"target_verify",outcome="graph",reason=""}} {graph}', f'{m}"decode",outcome="graph",reason=""}} 999']
    lines += [f'{m}"target_verify",outcome="eager",reason="{r}"}} {n}' for r, n in eager.items()]
    lines += [f'sglang:generation_tokens_total{{tp_rank="{rank}"}} {gen}' for rank in (0, 1)]
    return "\n".join(lines + [f'sglang:spec_verify_calls_total{{tp_rank="0"}} {calls}'])


def test_deltas_per_run_survive_resets_and_give_the_accept_length():
    before, after = _metrics(100, {"bs>max": 4}, 1000, 500), _metrics(160, {"bs>max": 4, "mixed": 2}, 1300, 620)
    d = observe.graph_delta(snap(None, before), snap(None, after))
    assert (d["graph"], d["eager"], d["fallback_reasons"], set(d["stages"])) == (60, 2, {"mixed": 2}, {"target_verify"})
    counted = snap(None, _metrics(0, {}, 1000, 500)), snap(None, _metrics(0, {}, 1300, 620))
    assert observe.accept_length(*counted) == pytest.approx(300 / 120)
    info = lambda g: {"internal_states": [{"spec_cuda_graph": {"target_verify": {"graph": g, "eager": 0}}}]}  # noqa
    assert observe.graph_delta(snap(info(50)), snap(info(12)))["graph"] == 12  # reset by /flush_cache: from zero
    # 70: the last run's window; 500: after the phase
    samples = [(0.0, 70.0, 0), (2.0, 70.0, 1), (3.0, 10.0, 1), (3.5, 60.0, 1), (4.0, 60.0, 1), (5.0, None, None)]
    samples += [(6.0, 64.0, 1), (9.0, 500.0, 0)]
    assert observe.decode_rate(samples, 2.0, 8.0, "metrics")["decode_tok_s_samples"] == [10.0, 60.0, 64.0]


def test_the_committed_plan_is_aba_over_four_variants_at_c1_c4_c16():
    p = pl.build(*pl.parse([]))
    assert [s.name for s in p.scenarios] == ["C1", "C4", "C16"]
    assert all(s.dataset_name == "random-ids" for s in p.scenarios)
    assert [v.name for v in p.variants] == ["stock-nospec", "stock-eagle3", "patched-nospec", "patched-eagle3"]
    assert [r.letter for r in p.runs[::3]] == list("ABCDDCBAABCD")
    assert len(p.runs) == 36 and len(p.sessions) == 10
    assert p.seconds == pytest.approx(3 * 4 * (92.16 + 51.2 + 51.2) + 10 * pl.ASSUMED_LOAD_S, rel=0.01)
    stock, patched = p.launches["stock-eagle3"].argv, p.launches["patched-eagle3"].argv
    serve = "serve --profile kimi-k25-eagle3-tp8 --model moonshotai/Kimi-K2.5 --port 30000 --draft-model"
    assert patched[patched.index(IMAGE) + 1 :] == (*serve.split(), "lightseekorg/kimi-k2.5-eagle3")
    assert stock[stock.index("--entrypoint") + 1] == "python3" and "scripts.host.serve" in stock
    assert (p.gpus, p.port, p.weights) == (8, 30000, ["moonshotai/Kimi-K2.5", "lightseekorg/kimi-k2.5-eagle3"])


def test_the_dry_run_prints_the_plan_its_checks_and_every_command_and_writes_nothing(box, capsys):
    box["docker"].busy("4242, python3, 81000 MiB")  # a resident server holds the GPUs
    assert bench.main([*box["args"], "--dry-run", "--", "--max-running-requests", "8"]) == 2  # a check fails
    out = capsys.readouterr().out
    assert "plan: 2 run(s) (1 scenario(s) x 2 variant(s) x 1 repeat(s)) in 2 server session(s)" in out
    assert "2 load(s) of " in out and "~20m" in out  # 2 x 10 min of loads + the runs
    assert "docker run -d " in out and "--name eagle-bench-nospec-pid" in out
    assert f"{IMAGE} serve --profile kimi-k25-tp8" in out
    assert "-- --max-running-requests 8" in out and f"{IMAGE} bench-client --backend sglang" in out
    assert f"-v {box['tmp'] / 'hub'}:/root/.cache/huggingface/hub" in out  # $HF_HUB_CACHE, what serve mounts too
    assert f"-v {box['tmp'] / 'model'}:{box['tmp'] / 'model'}:ro" in out  # a model directory: mounted where it is
    checks = ["ok   docker engine", f"ok   image {IMAGE}", "ok   GPUs: 8 x NVIDIA RTX PRO 6000", "ok   weights"]
    checks += ["FAIL GPUs idle: 4242, python3, 81000 MiB. Fix: stop what holds them", "ok   results directory"]
    assert [c for c in checks if c not in out] == [] and "not checked here: the servers' SGLang arguments" in out
    assert not box["res"].exists() and not [c for c in box["docker"].calls() if "-d" in c]


def test_checks_stop_a_real_run_before_any_server(box):
    """Concurrency above max-running-requests stops the plan; a results directory that cannot be written, a missing
    drafter and a stale image are named together, before any `docker run -d`; so is a profile that does not exist."""
    scen = box["tmp"] / "big.toml"
    scen.write_text(
        '[[scenario]]\nname = "C1000"\nmax_concurrency = 1000\nnum_prompts = 1000\ninput_len = 8\noutput_len = 8\n'
    )
    dry = [*box["args"], "--scenarios-file", str(scen), "--dry-run"]
    with pytest.raises(UserError, match="max_concurrency 1000 is above max-running-requests 16 of eagle3"):
        bench.main(dry)
    assert bench.main([*dry, "--", "--max-running-requests", "1000"]) == 0
    ro = box["tmp"] / "a-file"
    ro.write_text("")
    (box["tmp"] / "draft" / "config.json").unlink()
    config = box["docker"].state / "config.json"
    config.write_text(config.read_text().replace(patchset_id(), "0000000stale"))
    with pytest.raises(UserError) as e:
        bench.main([*box["args"], "--results-dir", str(ro / "results")])
    msg = str(e.value)
    assert msg.startswith("make bench cannot start; nothing was started or written")
    assert "FAIL results directory" in msg and "FAIL weights" in msg and "holds no config.json" in msg
    assert f"FAIL image {IMAGE}: image {IMAGE} holds patch set 0000000stale" in msg and "Fix: make image" in msg
    assert not [c for c in box["docker"].calls() if "-d" in c] and not (ro / "results").exists()
    bad = box["tmp"] / "variants.toml"
    bad.write_text(bad.read_text().replace('profile = "kimi-k25-tp8"\n[[variant]]', 'profile = "nope"\n[[variant]]'))
    with pytest.raises(UserError, match="no profile nope"):
        bench.main([*box["args"], "--dry-run"])


def test_the_box_route_end_to_end(box):
    """Each variant's server in a named detached container, the records with its counters; a container that dies while
    starting, and one whose port another server answers, are stopped all the same, and none of their numbers kept."""
    variants = ["--variants", "nospec,eagle3,exit,another"]
    cp = bench_verb(*box["args"], *variants, "--write-baseline", box["tmp"] / "base.json")
    assert cp.returncode == 4, cp.stderr[-3000:]  # the broken variants' runs produced no result
    assert "[3/4] C2 exit repeat 1 (C): server did not start: exit exited while starting" in cp.stderr
    assert "[4/4] C2 another repeat 1 (D): server did not start: another: the server answering at" in cp.stderr
    assert f"it serves 1 on port ?, not {box['tmp'] / 'model'}" in cp.stderr
    runs = [c for c in box["docker"].calls() if c[0] == "run" and "-d" in c]
    names = [c[c.index("--name") + 1] for c in runs]
    assert len(set(names)) == 4 and all(["rm", "-f", n] in box["docker"].calls() for n in names)
    assert not box["docker"].running()  # every stand-in stopped
    (results,) = box["res"].glob("*.jsonl")
    recs = [json.loads(ln) for ln in results.read_text().splitlines()]
    a, b = (r["eagle"] for r in recs)
    assert (a["variant"], a["letter"], b["variant"], b["letter"]) == ("nospec", "A", "eagle3", "B")
    assert a["patchset"] == b["patchset"] == patchset_id() and a["box"] == "b" and a["launched"]
    assert a["verify"] is None and b["verify"]["source"] == "metrics" and b["verify"]["eager"] > 0
    assert b["accept_length_metrics"] == pytest.approx(2.0, abs=0.15) and recs[1]["completed"] == 8
    assert a["decode_tok_s"] > 0 and a["client_args"][a["client_args"].index("--output-file") + 1][:9] == "/results/"
    md = results.with_suffix(".md").read_text()
    assert "| A | nospec |" in md and "Verify forwards off their CUDA graph" in md
    assert {e["variant"] for e in json.loads((box["tmp"] / "base.json").read_text())["entries"]} == {"nospec", "eagle3"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_a_signal_stops_the_server_or_the_next_run_does(box, sig):
    """SIGTERM and SIGHUP (a dropped ssh) take Ctrl-C's way out: the detached server is stopped and removed. After a
    SIGKILL nothing can run; the next run finds the container its process left and stops it before it starts."""
    docker = box["docker"]
    p = _fake_docker.interrupted(
        "scripts.bench.bench", *box["args"], "--variants", "mute", when=docker.running, sig=sig
    )
    name = next(c[c.index("--name") + 1] for c in docker.runs())
    assert p.returncode == (-9 if sig == signal.SIGKILL else 128 + sig), p.stderr.read()[-2000:]
    if sig != signal.SIGKILL:
        assert "stopping mute" in p.stderr.read() and ["rm", "-f", name] in docker.calls() and not docker.running()
        return
    assert docker.running() == [name]
    cp = bench_verb(*box["args"], "--variants", "nospec")
    assert cp.returncode == 0 and ["rm", "-f", name] in docker.calls() and not docker.running(), cp.stderr[-3000:]


def test_a_running_server_with_an_api_key(box, tmp_path):
    """--server-url: a 401 is named with the fix; the key from --api-key-file is sent, in no output, log or result."""
    key = "k3y-" + "5ecret" * 4
    (tmp_path / "key").write_text(key + "\n")
    with standin_server.serving("patched", api_key=key) as url:
        args = [*box["args"], "--server-url", f"s={url}", "--patchset", "s=abc"]
        no_key, keyed = bench_verb(*args), bench_verb(*args, "--api-key-file", tmp_path / "key")
    assert no_key.returncode == 4 and "export SGLANG_API_KEY=<its key>, or pass --api-key-file FILE" in no_key.stderr
    assert keyed.returncode == 0, keyed.stderr[-3000:]
    (results,) = box["res"].glob("*.jsonl")
    assert json.loads(results.read_text())["eagle"]["patchset"] == "abc"
    assert all(key not in cp.stdout + cp.stderr for cp in (no_key, keyed))
    assert all(key not in f.read_text(errors="replace") for f in box["res"].iterdir())


def test_reports_and_baselines_of_a_results_file(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    results.write_text((FIX / "results_abba.jsonl").read_text())
    base = tmp_path / "base.json"
    assert bench.main(["--report", str(results), "--write-baseline", str(base)]) == 0
    assert results.with_suffix(".md").is_file() and results.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert bench.main(["--report", str(results), "--baseline", str(base)]) == 0
    doc = json.loads(base.read_text())
    doc["entries"][0]["output_tok_s"] *= 2
    base.write_text(json.dumps(doc))
    assert bench.main(["--report", str(results), "--baseline", str(base)]) == 1
    assert "REGRESSION against" in capsys.readouterr().err
    rows = rep.summarize(rep.load_results(results))
    assert [(r.scenario, r.variant, r.n) for r in rows] == [("C2", "stock", 2), ("C2", "patched", 2)]


@pytest.mark.parametrize("target", ["bench", "bench-sweep", "bench-comm", "report"])
def test_make_dry_runs_print_their_plans_and_write_nothing(target, tmp_path):
    status = ["git", "status", "--porcelain", "--ignored", "bench"]
    before = subprocess.run(status, cwd=ROOT, capture_output=True, text=True).stdout
    env = {**client_env(), "PATH": f"{tmp_path}{os.pathsep}/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/x.sock"}
    cp = subprocess.run(["make", "-s", target, "DRY_RUN=1"], cwd=ROOT, capture_output=True, text=True, env=env)
    flat = " ".join(cp.stdout.replace("\\\n", " ").split())  # make bench-comm: the docker run, one option a line
    assert "plan:" in cp.stdout or "total: ~" in cp.stdout or "docker run --rm --gpus all" in flat, cp.stderr
    assert "Traceback" not in cp.stderr and cp.returncode in (0, 2)
    assert subprocess.run(status, cwd=ROOT, capture_output=True, text=True).stdout == before


def test_the_lent_route_benches_its_tiny_servers_through_server_url(tmp_path, monkeypatch):
    """bench/device/lent.py: the tiny bench and the DFlash arm's proxy on a lent GPU machine (no GPU here)."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "gpu" / "serve"))
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "device"))
    import _servers
    import lent

    args = lent.server_args("eagle3.yaml", 32010, tmp_path / "draft-pi")
    assert Path(args[args.index("--config") + 1]).is_file()
    assert args[-2:] == ["--speculative-draft-model-path", str(tmp_path / "draft-pi")]
    assert set(_servers.LENT_FLAGS) <= set(args) and args[args.index("--nccl-port") + 1] == "32015"
    urls = {"tiny-nospec": "http://127.0.0.1:32000", "tiny-eagle3": "http://127.0.0.1:32010"}
    argv = lent.bench_argv(urls, tmp_path, FIX / "tokenizer", "0123456789ab", "H200-x1-lent")
    p = pl.build(*pl.parse(argv[3:]))
    assert [r.letter for r in p.runs] == list("ABBA") and p.port is None and p.results_dir == tmp_path
    assert {x.patchset for x in p.launches.values()} == {"0123456789ab"}
    assert not any(x.argv for x in p.launches.values())
    assert lent.profile_argv(urls, tmp_path)[-2:] == ["--out", str(tmp_path / "profile.json")]
    servers = lent.SERVERS["sweep-tiny"]
    assert [p for _, p, _ in servers] == ["nospec.yaml", "eagle3.yaml", "dflash.yaml"]
    assert [d for _, _, d in servers] == [None, "draft-pi", "dflash-first"]
    urls = {name: f"http://127.0.0.1:{32000 + 10 * i}" for i, (name, _, _) in enumerate(servers)}
    argv = lent.bench_argv(urls, tmp_path, FIX / "tokenizer", "0123456789ab", "lent")
    runs = pl.build(*pl.parse([*argv[3:], *lent.ARGS["sweep-tiny"]])).runs
    assert [(r.scenario.name, r.variant.name) for r in runs] == [(s, v) for v in urls for s in ("C1-chat", "C1-code")]
    assert all((ROOT / r.scenario.extra_args[1]).is_file() and r.scenario.dataset_name == "custom" for r in runs)
