"""moebench.check: registry, selection, JSON / JUnit output, WAIVED paths, import containment."""
import json
import xml.etree.ElementTree as ET

import pytest

from moebench import check
from moebench.checks import ep, registry, system
from moebench.checks.registry import FAIL, PASS, WAIVED, Context, Outcome


def test_select_key_family_prefix():
    keys = lambda cs: [c.key for c in cs]  # noqa: E731
    assert keys(registry.select()) == [k for k, c in registry.REGISTRY.items() if not c.optional]   # fault.*: named
    assert keys(registry.select(["env"])) == ["env"]
    assert keys(registry.select(["hybridep"])) == [k for k in registry.REGISTRY if k.startswith("hybridep.")]
    assert keys(registry.select(None, ["deepep."])) == ["deepep.import", "deepep.roundtrip", "deepep.ll-roundtrip"]
    assert list(registry.REGISTRY)[-1] == "baseline"
    for bad in (["nope"],), (None, ["zz"]):
        with pytest.raises(registry.SelectionError):
            registry.select(*bad)


def test_list_and_bad_usage(capsys):
    assert check.main(["-l"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in registry.REGISTRY)
    assert check.main(["-t", "no-such-check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown check 'no-such-check'" in err
    assert check.main(["--bogus-flag"]) == 2      # a usage error is the exit code main() returns
    assert check.main(["--tp", "0"]) == 2


@pytest.fixture
def fake_checks(monkeypatch):
    reg = {"a.pass": registry.Check("a.pass", "d", lambda c: Outcome(PASS, "fine", {"rows": []})),
           "a.waive": registry.Check("a.waive", "d", lambda c: Outcome(WAIVED, "cannot run here")),
           "b.fail": registry.Check("b.fail", "d", lambda c: Outcome(FAIL, "broken <&>", {"x": 1}))}
    monkeypatch.setattr(registry, "REGISTRY", reg)
    monkeypatch.setattr(check, "REGISTRY", reg)
    return reg


def test_json_and_junit_round_trip(fake_checks, tmp_path):
    j, x = tmp_path / "r.json", tmp_path / "r.xml"
    assert check.main(["--out", str(j), "--junit", str(x)]) == 1          # b.fail FAILs
    doc = json.loads(j.read_text())
    assert doc["schema"] == "moebench.check/1" and doc["counts"] == {PASS: 1, FAIL: 1, WAIVED: 1}
    assert [(r["key"], r["status"]) for r in doc["results"]] == [("a.pass", PASS), ("a.waive", WAIVED), ("b.fail", FAIL)]
    assert set(doc["results"][0]) == {"key", "status", "summary", "details", "seconds"}
    assert "torch" in doc["env"]
    suite = ET.parse(x).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["a.waive"].find("skipped").get("message") == "cannot run here"
    assert cases["b.fail"].find("failure").get("message") == "broken <&>"
    assert cases["a.pass"].find("failure") is None and cases["a.pass"].find("skipped") is None


def test_terminal_lines_fit_160_columns_and_the_json_keeps_the_whole(fake_checks, tmp_path, capsys):
    long = "a reason " * 40
    fake_checks["a.waive"] = registry.Check("a.waive", "d", lambda c: Outcome(WAIVED, long))
    j = tmp_path / "r.json"
    check.main(["--out", str(j)])
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 160 and "--wide" in lines[-1]
    assert next(r for r in json.loads(j.read_text())["results"] if r["key"] == "a.waive")["summary"] == long
    check.main(["--wide"])
    assert any(line.endswith(long) for line in capsys.readouterr().out.splitlines())


def test_exit_zero_without_fail(fake_checks):
    assert check.main(["-p", "a."]) == 0
    assert check.main(["-t", "b"]) == 1


def _opts(**kw):
    args = check.parser().parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def _run(key, **kw):
    ctx = Context(_opts(**kw))
    return registry.run_check(registry.REGISTRY[key], ctx)


@pytest.mark.slow
def test_waived_without_gpu_or_deep_ep():
    import importlib.util

    import torch
    if torch.cuda.is_available() or importlib.util.find_spec("deep_ep"):
        pytest.skip("machine has a GPU or deep_ep")
    for key in ("p2p", "nccl", "deepep.import", "deepep.roundtrip", "hybridep.roundtrip", "hybridep.build"):
        r = _run(key)
        assert r.status == WAIVED and r.summary, key
    assert "not installed" in _run("deepep.import").summary
    assert _run("env").status == PASS


def test_nvml_waived_without_driver():
    try:
        system.nvml()
        pytest.skip("NVML works here")
    except Exception:  # noqa: BLE001
        pass
    for key in ("gpu", "nvlink"):
        r = _run(key)
        assert r.status == WAIVED and "NVML" in r.summary


def _fake_deep_ep(tmp_path, monkeypatch, init: str, utils: str = ""):
    pkg = tmp_path / "deep_ep"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init)
    if utils:
        (pkg / "utils.py").write_text(utils)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_deep_ep_crashing_on_import_is_fail(tmp_path, monkeypatch):
    _fake_deep_ep(tmp_path, monkeypatch, "import os\nos.abort()\n")
    r = _run("deepep.import")
    assert r.status == FAIL and "SIGABRT" in r.summary
    assert _run("hybridep.roundtrip").status == FAIL          # no round trip on a crashing install


@pytest.mark.slow
def test_deep_ep_v2_without_legacy_api_is_fail(tmp_path, monkeypatch):
    _fake_deep_ep(tmp_path, monkeypatch, "__version__ = '2.1.0'\nclass ElasticBuffer: pass\n")
    r = _run("deepep.import")
    assert r.status == FAIL and "no legacy deep_ep.Buffer" in r.summary and "hybrid-ep" in r.summary
    assert _run("hybridep.import").status == WAIVED           # no HybridEPBuffer: nothing to accept


def test_deep_ep_without_event_overlap_is_fail(tmp_path, monkeypatch):
    _fake_deep_ep(tmp_path, monkeypatch, "__version__ = '1.2.1'\nclass Buffer: pass\n", "class EventHandle: pass\n")
    r = _run("deepep.import")
    assert r.status == FAIL and "EventOverlap" in r.summary and "silently" in r.summary


def test_deep_ep_ok(tmp_path, monkeypatch):
    _fake_deep_ep(tmp_path, monkeypatch, "__version__ = '1.2.1'\nclass Buffer: pass\n",
                  "class EventHandle: pass\nclass EventOverlap: pass\n")
    r = _run("deepep.import")
    assert r.status == PASS and "1.2.1" in r.summary


def _sysfs(root, dev, port, state, rate, layer, numa="0"):
    p = root / "class" / "infiniband" / dev / "ports" / port
    p.mkdir(parents=True)
    (p / "state").write_text(state + "\n")
    (p / "rate").write_text(rate + "\n")
    (p / "link_layer").write_text(layer + "\n")
    (root / "class" / "infiniband" / dev / "device").mkdir(exist_ok=True)
    (root / "class" / "infiniband" / dev / "device" / "numa_node").write_text(numa + "\n")


def test_nic_from_fake_sysfs(tmp_path):
    assert _run("nic", sysfs_root=str(tmp_path)).status == WAIVED
    _sysfs(tmp_path, "mlx5_0", "1", "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand")
    _sysfs(tmp_path, "mlx5_1", "1", "1: DOWN", "400 Gb/sec (4X NDR)", "InfiniBand", "1")
    _sysfs(tmp_path, "efa_0", "1", "4: ACTIVE", "100 Gb/sec", "Unspecified", "1")
    nics = system.scan_nics(tmp_path)
    assert [(n["device"], n["kind"], n["active"], n["rate_Gbps"]) for n in nics] == [
        ("efa_0", "EFA", True, 100.0), ("mlx5_0", "InfiniBand", True, 400.0), ("mlx5_1", "InfiniBand", False, 400.0)]
    s = system.nic_summary(nics, [0, 1])
    assert s["node_net_GBps"] == 62.5 and s["per_gpu_net_ceiling_GBps"] == 12.5   # GPU 1 has efa_0 alone: its share
    assert s["gpu_nic_affinity"] == {0: ["mlx5_0/1"], 1: ["efa_0/1"]}
    r = _run("nic", sysfs_root=str(tmp_path))
    assert r.status == PASS and "mlx5_1/1" in r.summary


def test_nic_all_down_fails(tmp_path):
    _sysfs(tmp_path, "mlx5_0", "1", "1: DOWN", "400 Gb/sec", "Ethernet")
    r = _run("nic", sysfs_root=str(tmp_path))
    assert r.status == FAIL and "no RDMA port is ACTIVE" in r.summary


def test_judges():
    assert system.judge_gpus([{"index": 0, "name": "H200", "ecc_uncorrected_volatile": 2}]) == [
        "GPU 0: 2 uncorrected ECC errors"]
    assert "mixed GPU SKUs" in system.judge_gpus([{"index": 0, "name": "A"}, {"index": 1, "name": "B"}])[0]
    from moebench.env.topology import GPU
    probs, _ = system.judge_links([GPU(0, "NVIDIA H200", nvlinks_up=18), GPU(1, "NVIDIA H200", nvlinks_up=16),
                                   GPU(2, "NVIDIA H100 PCIe", nvlinks_up=0)])
    assert probs == ["GPU 1 (NVIDIA H200): 16 of 18 NVLinks up"]
    assert ep.judge_domain(None, 8, 8, 1, "intranode") == ([], [])
    p, _ = ep.judge_domain(None, 8, 8, 2, "intranode")
    assert "leaves the NVLink domain" in p[0] and "HYBRID_EP_MULTINODE" in p[0]
    p, n = ep.judge_domain(None, 8, 16, 1, "multinode")
    assert p == [] and "2 NVLink domains" in n[0]
    assert "> detected NVLink domain" in ep.judge_domain("16", 8, 16, 1, "multinode")[0][0]
    assert "does not divide" in ep.judge_domain("4", 8, 6, 1, None)[0][0]
    assert "not a positive integer" in ep.judge_domain("x", 8, 8, 1, None)[0][0]


def test_judge_megatron():
    v = {"HAVE_DEEP_EP": False, "HAVE_HYBRIDEP": True, "deepep_error": "ImportError: no EventOverlap"}
    p = ep.judge_megatron(v, {"deepep", "hybridep"})
    assert len(p) == 1 and "EventOverlap" in p[0] and "silently" in p[0] and "deep_ep is installed" in p[0]
    assert ep.judge_megatron(v, set()) == []
    assert "HAVE_HYBRIDEP=None" in ep.judge_megatron({}, {"hybridep"})[0]


def test_judge_p2p():
    from moebench.checks import comm
    data = {"devices": ["NVIDIA H200"] * 3, "bytes": 1 << 20,
            "can_access": [[1, 1, 1], [1, 1, 0], [1, 1, 1]],
            "copy_GBps": [[2000, 390, 385], [388, 2000, None], [200, 391, 2000]]}
    problems, rows = comm.judge_p2p(data, 450.0)
    assert "GPU 1 cannot access GPU 2 (no peer access)" in problems
    assert any(p.startswith("2->0: 200 GB/s") for p in problems)
    assert len(rows) == 5 and {r["phase"] for r in rows} == {"0->1", "0->2", "1->0", "2->0", "2->1"}
    ok, _ = comm.judge_p2p({**data, "can_access": [[1] * 3] * 3,
                            "copy_GBps": [[1, 390, 385], [388, 1, 380], [379, 391, 1]]}, 450.0)
    assert ok == []


@pytest.mark.gpu
@pytest.mark.slow
def test_run_on_gpu(tmp_path):
    """GPU tier: env and gpu PASS; on one GPU the link checks are WAIVED with a reason. A FAIL (e.g. the megatron
    check on a DeepEP built without NVSHMEM) carries its reason and exit 1. The backends' round trips are the GPU
    tier's backend matrix (tests/backends/test_gpu_backends.py, the same harness), and the nvshmem and low-latency
    checks (~45 s on the H200) run in bench/ check runs, so that `pytest -m gpu` fits its 5 minutes."""
    import torch
    out = tmp_path / "check.json"
    keys = ("env", "gpu", "nvlink", "p2p", "nccl", "megatron")
    rc = check.main(["--out", str(out), "--junit", str(tmp_path / "check.xml"), *(a for k in keys for a in ("-t", k))])
    res = {r["key"]: r for r in json.loads(out.read_text())["results"]}
    assert res["env"]["status"] == PASS and res["gpu"]["status"] == PASS
    if torch.cuda.device_count() == 1:
        for key in ("p2p", "nccl"):
            assert res[key]["status"] == WAIVED and res[key]["summary"], key
    assert all(r["summary"] for r in res.values() if r["status"] == FAIL), res
    assert rc == (1 if any(r["status"] == FAIL for r in res.values()) else 0)
