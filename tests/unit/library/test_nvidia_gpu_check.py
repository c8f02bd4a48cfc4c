"""nvidia_gpu_check: the real main() on recorded nvidia-smi outputs (tests/fixtures/nvidia_smi/)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia_smi"

import ansible.module_utils  # noqa: E402

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils import basic, sglang_nvidia  # noqa: E402  (sglang_nvidia: after the path is extended)
from ansible.module_utils.testing import patch_module_args  # noqa: E402


def _load_module():
    path = REPO / "library" / "nvidia_gpu_check.py"
    spec = importlib.util.spec_from_file_location("nvidia_gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nvidia_gpu_check"] = module
    spec.loader.exec_module(module)
    return module


MODULE = _load_module()


class _Exit(Exception):
    def __init__(self, result, failed):
        super().__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


def _exit_json(self, **kwargs):
    kwargs.setdefault("failed", False)
    raise _Exit(json.loads(json.dumps(kwargs)), False)


def _fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise _Exit(json.loads(json.dumps(kwargs)), True)


def _fixture(*parts):
    return (FIXTURES.joinpath(*parts)).read_text()


@pytest.fixture
def host(tmp_path):
    """A host's /proc and /sys files in tmp_path, defaulting to the passing 8-GPU host."""
    files = {
        "version": tmp_path / "version",
        "cmdline": tmp_path / "cmdline",
        "groups": tmp_path / "iommu_groups",
    }
    files["version"].write_text(_fixture("rtx_pro_6000_se_8gpu", "proc_driver_nvidia_version.txt"))
    files["cmdline"].write_text("BOOT_IMAGE=/vmlinuz-6.8.0-90-generic root=/dev/sda2 ro iommu=pt\n")
    files["groups"].mkdir()
    for n in range(4):
        (files["groups"] / str(n)).mkdir()
    return files


def run_module(host, args=None, query=None, topo=None, rc=0, smi_found=True):
    """Run main() with run_command answering nvidia-smi from fixtures; returns (result, calls)."""
    query = _fixture("rtx_pro_6000_se_8gpu", "query.csv") if query is None else query
    topo = _fixture("rtx_pro_6000_se_8gpu", "topo_m.txt") if topo is None else topo
    calls = []
    warnings = []

    def run_command(self, cmd, **kwargs):
        calls.append((list(cmd), kwargs))
        assert isinstance(cmd, list), "run_command must be given a list"
        if cmd[1].startswith("--query-gpu="):
            return rc, query, "NVIDIA-SMI has failed" if rc else ""
        if cmd[1:] == ["topo", "-m"]:
            return 0, topo, ""
        raise AssertionError(f"unexpected command {cmd}")

    module_args = {
        "driver_version_file": str(host["version"]),
        "cmdline_file": str(host["cmdline"]),
        "iommu_groups_dir": str(host["groups"]),
    }
    module_args.update(args or {})
    with (
        patch_module_args(module_args),
        mock.patch.object(basic.AnsibleModule, "run_command", run_command),
        mock.patch.object(
            basic.AnsibleModule,
            "get_bin_path",
            lambda self, arg, required=False, opt_dirs=None: "/usr/bin/nvidia-smi" if smi_found else None,
        ),
        mock.patch.object(basic.AnsibleModule, "warn", lambda self, text: warnings.append(text)),
        mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json),
        pytest.raises(_Exit) as exc,
    ):
        MODULE.main()
    result = exc.value.result
    result["warnings"] = warnings
    return result, calls


# ------------------------------------------------------------------ passing host


def test_passing_host_returns_parsed_gpus(host):
    result, calls = run_module(host)
    assert result["failed"] is False
    assert result["changed"] is False
    assert result["failed_checks"] == []
    assert result["gpu_count"] == 8
    first = result["gpus"][0]
    assert first == {
        "index": 0,
        "uuid": "GPU-8b89b58e-b427-108d-ac50-06138d78fe78",
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "driver_version": "580.126.09",
        "compute_cap": "12.0",
        "memory_total_mib": 97887,
        "persistence_mode": "Enabled",
        "ecc_mode": "Enabled",
    }
    assert [g["index"] for g in result["gpus"]] == list(range(8))
    assert result["kernel_module"]["flavour"] == "open"
    assert result["kernel_module"]["version"] == "580.126.09"
    # the exact commands, list form, LANG=C
    assert calls[0][0] == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,driver_version,compute_cap,memory.total,persistence_mode,ecc.mode.current",
        "--format=csv,noheader,nounits",
    ]
    assert calls[0][1]["environ_update"]["LANG"] == "C"
    assert calls[1][0] == ["/usr/bin/nvidia-smi", "topo", "-m"]


def test_check_mode_runs_the_same_read_only_checks(host):
    result, calls = run_module(host, {"_ansible_check_mode": True})
    assert result["failed"] is False and result["changed"] is False
    assert len(calls) == 2


# ------------------------------------------------------------------ failing hosts


@pytest.mark.parametrize(
    ("case", "args", "fragment"),
    [
        ("seven_gpus", {}, "expected_count: nvidia-smi lists 7 GPUs, expected 8"),
        ("old_driver_570", {}, "min_driver: driver 570.133.07 on GPU 0 is older than 580"),
        (
            "persistence_off",
            {},
            "require_persistence: persistence mode is not Enabled on GPU(s) 0,1,2,3,4,5,6,7 "
            "(is nvidia-persistenced running?)",
        ),
    ],
)
def test_failing_query_cases_name_the_setting(host, case, args, fragment):
    result, _ = run_module(host, args, query=_fixture(case, "query.csv"))
    assert result["failed"] is True
    assert result["failed_checks"] == [fragment]
    assert fragment in result["msg"]


def test_proprietary_module_fails_require_open_module(host):
    host["version"].write_text(_fixture("proprietary_module", "proc_driver_nvidia_version.txt"))
    result, _ = run_module(host)
    assert result["failed"] is True
    assert result["kernel_module"]["flavour"] == "proprietary"
    assert result["kernel_module"]["version"] == "570.181"
    assert len(result["failed_checks"]) == 1
    assert result["failed_checks"][0].startswith("require_open_module: ")
    assert "NVIDIA UNIX x86_64 Kernel Module  570.181" in result["failed_checks"][0]


def test_proprietary_module_allowed_when_not_required(host):
    host["version"].write_text(_fixture("proprietary_module", "proc_driver_nvidia_version.txt"))
    result, _ = run_module(host, {"require_open_module": False})
    assert result["failed"] is False


def test_missing_proc_file_is_not_open(host):
    host["version"].unlink()
    result, _ = run_module(host)
    assert result["failed"] is True
    assert "require_open_module" in result["failed_checks"][0]
    assert "no NVRM version line" in result["failed_checks"][0]


def test_wrong_model_and_compute_cap(host):
    result, _ = run_module(host, {"expected_model": "H100", "expected_compute_cap": "9.0"})
    assert result["failed"] is True
    assert result["failed_checks"][0].startswith("expected_model: GPU(s) 0,1,2,3,4,5,6,7 are NVIDIA RTX PRO")
    assert result["failed_checks"][1].startswith("expected_compute_cap: GPU 0 has 12.0")


def test_min_driver_full_version(host):
    result, _ = run_module(host, {"min_driver": "580.126.10"})
    assert result["failed_checks"] == ["min_driver: driver 580.126.09 on GPU 0 is older than 580.126.10"]
    result, _ = run_module(host, {"min_driver": "580.126.09"})
    assert result["failed"] is False


def test_several_failures_are_all_reported(host):
    host["version"].write_text(_fixture("proprietary_module", "proc_driver_nvidia_version.txt"))
    query = _fixture("seven_gpus", "query.csv").replace("Enabled, Enabled", "Disabled, Enabled")
    result, _ = run_module(host, query=query)
    keys = [c.split(":", 1)[0] for c in result["failed_checks"]]
    assert keys == ["expected_count", "require_persistence", "require_open_module"]


def test_nvidia_smi_error_fails_with_its_text(host):
    result, _ = run_module(host, rc=9)
    assert result["failed"] is True
    assert result["msg"].startswith("nvidia_smi: /usr/bin/nvidia-smi --query-gpu=")
    assert "exited 9: NVIDIA-SMI has failed" in result["msg"]


def test_nvidia_smi_missing(host):
    result, _ = run_module(host, {"nvidia_smi": "nvidia-smi-absent"}, smi_found=False)
    assert result["failed"] is True
    assert "nvidia_smi: 'nvidia-smi-absent' not found" in result["msg"]


def test_unparsable_query_output_names_the_option(host):
    result, _ = run_module(host, query="NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.126.09, 12.0\n")
    assert result["failed"] is True
    assert result["msg"].startswith(
        "nvidia_smi: cannot parse --query-gpu output: line 1: 3 fields, expected 8"
    )


def test_bad_min_driver_option(host):
    result, _ = run_module(host, {"min_driver": "latest"})
    assert result["failed"] is True
    assert result["msg"] == "min_driver: 'latest' is not a version number"


# ------------------------------------------------------------------ NCCL P2P risk


def test_risk_reported_for_root_complex_paths_with_iommu_translated(host):
    host["cmdline"].write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda2 ro quiet\n")
    result, _ = run_module(host)
    assert result["failed"] is False, "risk is reported, the decision is the play's"
    assert result["nccl_p2p_risk"] is True
    assert result["iommu"] == {"mode": "translated", "groups": 4, "cmdline_settings": {}}
    assert len(result["nccl_p2p_risk_reasons"]) == 2
    assert "through the CPU root complex (NODE/SYS)" in result["nccl_p2p_risk_reasons"][0]
    assert "IOMMU DMA translation is active" in result["nccl_p2p_risk_reasons"][1]
    assert result["warnings"] == [f"NCCL P2P risk: {r}" for r in result["nccl_p2p_risk_reasons"]]


def test_risk_from_topology_alone_when_iommu_passthrough(host):
    result, _ = run_module(host)
    assert result["iommu"]["mode"] == "passthrough"
    assert result["iommu"]["cmdline_settings"] == {"iommu": "pt"}
    assert result["nccl_p2p_risk"] is True
    assert len(result["nccl_p2p_risk_reasons"]) == 1
    # 28 pairs among 8 GPUs of the recorded topology: 4 PIX, 8 NODE, 16 SYS
    assert result["nccl_p2p_risk_reasons"][0].startswith("24 GPU pair(s)")


def test_two_gpu_phb_host_where_nccl_hung(host):
    query = "".join(_fixture("rtx_pro_6000_se_8gpu", "query.csv").splitlines(keepends=True)[:2])
    topo = _fixture("topo_2gpu_phb", "topo_m.txt")
    result, _ = run_module(host, {"expected_count": 2}, query=query, topo=topo)
    assert result["topology"]["matrix"] == {
        "GPU0": {"GPU0": "X", "GPU1": "PHB"},
        "GPU1": {"GPU0": "PHB", "GPU1": "X"},
    }
    assert result["nccl_p2p_risk"] is True
    assert "(PHB)" in result["nccl_p2p_risk_reasons"][0]


# ------------------------------------------------------------------ parsers


def test_topology_parser_on_trimmed_8gpu_output():
    topo = sglang_nvidia.parse_topology(_fixture("rtx_pro_6000_se_8gpu", "topo_m.txt"))
    assert topo["gpus"] == [f"GPU{n}" for n in range(8)]
    assert topo["matrix"]["GPU0"]["GPU1"] == "PIX"
    assert topo["matrix"]["GPU2"]["GPU0"] == "NODE"
    assert topo["matrix"]["GPU7"]["GPU3"] == "SYS"
    assert topo["matrix"]["GPU5"]["GPU5"] == "X"


def test_no_risk_for_switch_only_pair_with_passthrough():
    topo = sglang_nvidia.parse_topology(_fixture("rtx_pro_6000_se_8gpu", "topo_m.txt"))
    pix_only = {
        "devices": ["GPU0", "GPU1"],
        "gpus": ["GPU0", "GPU1"],
        "matrix": {g: {h: topo["matrix"][g][h] for h in ("GPU0", "GPU1")} for g in ("GPU0", "GPU1")},
    }
    passthrough = sglang_nvidia.iommu_state("ro iommu=pt", 40)
    assert sglang_nvidia.assess_nccl_p2p_risk(pix_only, passthrough) == {
        "risk": False,
        "reasons": [],
        "host_bridge_pairs": [],
    }
    translated = sglang_nvidia.iommu_state("ro", 40)
    assert sglang_nvidia.assess_nccl_p2p_risk(pix_only, translated)["risk"] is True


def test_topology_parser_with_nic_and_legend():
    text = (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tSYS\tPIX\t0-15\t0\t\tN/A\n"
        "GPU1\tSYS\t X \tSYS\t16-31\t1\t\tN/A\n"
        "NIC0\tPIX\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n"
    )
    topo = sglang_nvidia.parse_topology(text)
    assert topo["gpus"] == ["GPU0", "GPU1"]
    assert topo["devices"] == ["GPU0", "GPU1", "NIC0"]
    assert sglang_nvidia.gpu_pairs(topo) == [("GPU0", "GPU1", "SYS")]


def test_topology_parser_rejects_garbage():
    with pytest.raises(sglang_nvidia.ParseError):
        sglang_nvidia.parse_topology("No devices were found\n")


@pytest.mark.parametrize(
    ("cmdline", "groups", "mode"),
    [
        ("ro quiet", 0, "off"),
        ("ro quiet", 12, "translated"),
        ("ro intel_iommu=on iommu=pt", 12, "passthrough"),
        ("ro amd_iommu=off", 12, "off"),
        ("ro iommu=off", 12, "off"),
        ("ro iommu.passthrough=1", 12, "passthrough"),
    ],
)
def test_iommu_state(cmdline, groups, mode):
    assert sglang_nvidia.iommu_state(cmdline, groups)["mode"] == mode


def test_driver_version_file_parser_on_recordings():
    open_580 = sglang_nvidia.parse_driver_version_file(
        _fixture("rtx_pro_6000_se_8gpu", "recorded_proc_driver_nvidia_version_580.95.05.txt")
    )
    assert (open_580["flavour"], open_580["version"]) == ("open", "580.95.05")
    proprietary = sglang_nvidia.parse_driver_version_file(
        _fixture("proprietary_module", "proc_driver_nvidia_version.txt")
    )
    assert (proprietary["flavour"], proprietary["version"]) == ("proprietary", "570.181")
    assert sglang_nvidia.parse_driver_version_file("")["flavour"] == "unknown"


def test_query_parser_keeps_not_available_as_none():
    gpus = sglang_nvidia.parse_query_csv(
        "0, GPU-8b89b58e-b427-108d-ac50-06138d78fe78, NVIDIA RTX PRO 6000 Blackwell Server Edition, "
        "580.126.09, 12.0, 97887, Enabled, [N/A]\n"
    )
    assert gpus[0]["ecc_mode"] is None


def test_recorded_query_has_the_same_identity_as_derived_fixture():
    """The derived query.csv keeps index/uuid/name of the verbatim recording (SOURCE.md)."""
    recorded = _fixture("rtx_pro_6000_se_8gpu", "recorded_query_index_name_uuid.csv").splitlines()[1:]
    derived = sglang_nvidia.parse_query_csv(_fixture("rtx_pro_6000_se_8gpu", "query.csv"))
    for line, gpu in zip(recorded, derived):
        index, name, uuid = (part.strip() for part in line.split(",")[:3])
        assert (int(index), name, uuid) == (gpu["index"], gpu["name"], gpu["uuid"])
    assert len(recorded) == len(derived) == 8


def test_ansible_doc_renders():
    import subprocess

    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-doc"), "-M", str(REPO / "library"), "nvidia_gpu_check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "expected_count" in out.stdout
