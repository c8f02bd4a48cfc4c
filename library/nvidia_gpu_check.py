#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu_check
short_description: Check that a host's NVIDIA GPUs are the ones SGLang is deployed for
description:
  - Runs C(nvidia-smi --query-gpu=index,uuid,name,driver_version,compute_cap,memory.total,persistence_mode,
    ecc.mode.current --format=csv,noheader,nounits) and C(nvidia-smi topo -m), reads
    C(/proc/driver/nvidia/version), C(/proc/cmdline) and C(/sys/kernel/iommu_groups).
  - Fails, naming every check that did not hold, when the GPU count, model, driver branch, compute
    capability, persistence mode or kernel module flavour differ from what is expected.
  - Reports whether NCCL peer-to-peer over PCIe is at known risk of hanging on this host
    (C(nccl_p2p_risk)); deciding about C(NCCL_P2P_DISABLE) is left to the inventory.
  - Changes nothing on the host.
version_added: "1.0.0"
author: the sglang-deploy authors
options:
  nvidia_smi:
    description: Path or name of the nvidia-smi binary.
    type: str
    default: nvidia-smi
  expected_count:
    description: Number of GPUs nvidia-smi must list.
    type: int
    default: 8
  expected_model:
    description: Substring every GPU name must contain.
    type: str
    default: RTX PRO 6000 Blackwell
  min_driver:
    description: Lowest acceptable driver version (C(580) or C(580.126.09)); compared numerically.
    type: str
    default: "580"
  expected_compute_cap:
    description: Compute capability every GPU must report.
    type: str
    default: "12.0"
  require_persistence:
    description: Every GPU must have persistence mode C(Enabled).
    type: bool
    default: true
  require_open_module:
    description:
      - The loaded kernel module must be the open flavour ("Open Kernel Module" in O(driver_version_file)).
    type: bool
    default: true
  driver_version_file:
    description: Where the loaded kernel module reports its version.
    type: path
    default: /proc/driver/nvidia/version
  cmdline_file:
    description: Kernel command line (for C(iommu=), C(intel_iommu=), C(amd_iommu=)).
    type: path
    default: /proc/cmdline
  iommu_groups_dir:
    description: Directory whose entries are the IOMMU groups.
    type: path
    default: /sys/kernel/iommu_groups
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
notes:
  - RTX PRO 6000 Blackwell cards need the open kernel modules; the proprietary flavour does not
    support Blackwell.
"""

EXAMPLES = r"""
- name: Check the GPUs
  nvidia_gpu_check:
    expected_count: 8
    expected_model: RTX PRO 6000 Blackwell
    min_driver: "580"
  register: gpu_check

- name: Require an explicit NCCL P2P decision when the host is at risk
  ansible.builtin.assert:
    that: not gpu_check.nccl_p2p_risk or nvidia_nccl_p2p_disable is defined
"""

RETURN = r"""
gpus:
  description: One entry per GPU, as nvidia-smi reported it.
  returned: when nvidia-smi ran
  type: list
  elements: dict
  sample:
    - index: 0
      uuid: GPU-8b89b58e-b427-108d-ac50-06138d78fe78
      name: NVIDIA RTX PRO 6000 Blackwell Server Edition
      driver_version: 580.126.09
      compute_cap: "12.0"
      memory_total_mib: 97887
      persistence_mode: Enabled
      ecc_mode: Enabled
gpu_count:
  description: Number of GPUs found.
  returned: when nvidia-smi ran
  type: int
  sample: 8
kernel_module:
  description: The loaded kernel module as /proc/driver/nvidia/version describes it.
  returned: always
  type: dict
  sample:
    flavour: open
    version: 580.126.09
    nvrm: "NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build .."
topology:
  description: GPU-to-GPU connection types from C(nvidia-smi topo -m).
  returned: when nvidia-smi ran
  type: dict
  sample: {gpus: [GPU0, GPU1], matrix: {GPU0: {GPU0: X, GPU1: PHB}, GPU1: {GPU0: PHB, GPU1: X}}}
iommu:
  description: IOMMU mode (off, passthrough, translated), group count and the kernel command line settings.
  returned: always
  type: dict
  sample: {mode: translated, groups: 84, cmdline_settings: {}}
nccl_p2p_risk:
  description: True when a condition known to hang NCCL peer-to-peer on these PCIe cards is present.
  returned: when nvidia-smi ran
  type: bool
  sample: true
nccl_p2p_risk_reasons:
  description: Why C(nccl_p2p_risk) is true (empty when it is false).
  returned: when nvidia-smi ran
  type: list
  elements: str
  sample: ["16 GPU pair(s) reach each other through the CPU root complex (SYS) ..."]
failed_checks:
  description: Every check that did not hold, each naming the option concerned.
  returned: always
  type: list
  elements: str
  sample: ["expected_count: nvidia-smi lists 7 GPUs, expected 8"]
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_nvidia import (
    QUERY_FIELDS,
    ParseError,
    assess_nccl_p2p_risk,
    iommu_state,
    parse_driver_version_file,
    parse_query_csv,
    parse_topology,
    parse_version,
)

RUN_ENV = {"LANG": "C", "LC_ALL": "C"}


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _count_entries(path):
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def evaluate(params, gpus, kernel_module):
    """List of failed checks (strings naming the option concerned)."""
    failed = []
    count = len(gpus)
    if count != params["expected_count"]:
        failed.append(f"expected_count: nvidia-smi lists {count} GPUs, expected {params['expected_count']}")
    wrong_model = [g for g in gpus if params["expected_model"] not in (g["name"] or "")]
    if wrong_model:
        names = sorted({g["name"] or "?" for g in wrong_model})
        indexes = ",".join(str(g["index"]) for g in wrong_model)
        failed.append(
            f"expected_model: GPU(s) {indexes} are {', '.join(names)}, "
            f"expected a name containing {params['expected_model']!r}"
        )
    minimum = parse_version(params["min_driver"])
    for gpu in gpus:
        try:
            found = parse_version(gpu["driver_version"])
        except ParseError:
            failed.append(
                f"min_driver: GPU {gpu['index']} reports no driver version ({gpu['driver_version']!r})"
            )
            continue
        if found < minimum:
            failed.append(
                f"min_driver: driver {gpu['driver_version']} on GPU {gpu['index']} "
                f"is older than {params['min_driver']}"
            )
            break
    wrong_cap = [g for g in gpus if g["compute_cap"] != params["expected_compute_cap"]]
    if wrong_cap:
        failed.append(
            "expected_compute_cap: "
            + ", ".join(f"GPU {g['index']} has {g['compute_cap']}" for g in wrong_cap)
            + f", expected {params['expected_compute_cap']}"
        )
    if params["require_persistence"]:
        off = [g for g in gpus if g["persistence_mode"] != "Enabled"]
        if off:
            failed.append(
                f"require_persistence: persistence mode is not Enabled on GPU(s) "
                f"{','.join(str(g['index']) for g in off)} (is nvidia-persistenced running?)"
            )
    if params["require_open_module"] and kernel_module["flavour"] != "open":
        failed.append(
            f"require_open_module: {params['driver_version_file']} reports "
            f'{kernel_module["nvrm"] or "no NVRM version line"!r}, not the "Open Kernel Module"'
        )
    return failed


def run_check(module):
    params = module.params
    result = {"changed": False, "failed_checks": []}

    kernel_text = _read(params["driver_version_file"])
    kernel_module = parse_driver_version_file(kernel_text or "")
    if kernel_text is None:
        kernel_module["nvrm"] = None
    result["kernel_module"] = kernel_module
    result["iommu"] = iommu_state(
        _read(params["cmdline_file"]) or "", _count_entries(params["iommu_groups_dir"])
    )

    smi = module.get_bin_path(params["nvidia_smi"], required=False)
    if smi is None:
        module.fail_json(
            msg=f"nvidia_smi: {params['nvidia_smi']!r} not found (is the driver installed?)", **result
        )

    query = [smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]
    rc, out, err = module.run_command(query, environ_update=RUN_ENV)
    if rc != 0:
        module.fail_json(
            msg=f"nvidia_smi: {' '.join(query)} exited {rc}: {(err or out).strip()}", rc=rc, **result
        )
    try:
        gpus = parse_query_csv(out)
    except ParseError as exc:
        module.fail_json(msg=f"nvidia_smi: cannot parse --query-gpu output: {exc}", stdout=out, **result)
    result["gpus"] = gpus
    result["gpu_count"] = len(gpus)

    topo_cmd = [smi, "topo", "-m"]
    rc, topo_out, err = module.run_command(topo_cmd, environ_update=RUN_ENV)
    if rc != 0:
        module.fail_json(
            msg=f"nvidia_smi: {' '.join(topo_cmd)} exited {rc}: {(err or topo_out).strip()}", **result
        )
    try:
        topology = parse_topology(topo_out)
    except ParseError as exc:
        module.fail_json(msg=f"nvidia_smi: cannot parse topo -m output: {exc}", stdout=topo_out, **result)
    result["topology"] = {"gpus": topology["gpus"], "matrix": topology["matrix"]}

    risk = assess_nccl_p2p_risk(topology, result["iommu"])
    result["nccl_p2p_risk"] = risk["risk"]
    result["nccl_p2p_risk_reasons"] = risk["reasons"]
    for reason in risk["reasons"]:
        module.warn(f"NCCL P2P risk: {reason}")

    result["failed_checks"] = evaluate(params, gpus, kernel_module)
    if result["failed_checks"]:
        module.fail_json(msg="GPU check failed: " + "; ".join(result["failed_checks"]), **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "expected_count": {"type": "int", "default": 8},
            "expected_model": {"type": "str", "default": "RTX PRO 6000 Blackwell"},
            "min_driver": {"type": "str", "default": "580"},
            "expected_compute_cap": {"type": "str", "default": "12.0"},
            "require_persistence": {"type": "bool", "default": True},
            "require_open_module": {"type": "bool", "default": True},
            "driver_version_file": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "cmdline_file": {"type": "path", "default": "/proc/cmdline"},
            "iommu_groups_dir": {"type": "path", "default": "/sys/kernel/iommu_groups"},
        },
        supports_check_mode=True,
    )
    try:
        parse_version(module.params["min_driver"])
    except ParseError:
        module.fail_json(msg=f"min_driver: {module.params['min_driver']!r} is not a version number")
    run_check(module)


if __name__ == "__main__":
    main()
