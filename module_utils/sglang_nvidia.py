# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsing what the NVIDIA driver reports about a GPU host.

Pure functions over text, so the unit tests feed them recorded real outputs:

* ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``
  (one line per GPU, fields in the order asked for, ``[N/A]`` for unsupported values);
* ``nvidia-smi topo -m`` (a matrix of connection types between devices, then a legend);
* ``/proc/driver/nvidia/version`` (``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 ...``
  for the open flavour, ``NVRM version: NVIDIA UNIX x86_64 Kernel Module ...`` for the proprietary one);
* ``/proc/cmdline`` and the entries of ``/sys/kernel/iommu_groups`` (IOMMU mode).

and one judgement: :func:`assess_nccl_p2p_risk`, whether NCCL peer-to-peer over PCIe is known to be
at risk of hanging on this host (the inventory then has to decide about ``NCCL_P2P_DISABLE``).
"""

from __future__ import annotations

import csv
import io
import re

# Field names as `nvidia-smi --help-query-gpu` spells them, in the order the check asks for them.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "compute_cap",
    "memory.total",
    "persistence_mode",
    "ecc.mode.current",
)

# Keys of a parsed GPU (same order as QUERY_FIELDS).
GPU_KEYS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "compute_cap",
    "memory_total_mib",
    "persistence_mode",
    "ecc_mode",
)

NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]")

# `nvidia-smi topo -m` connection types between two GPUs.  PCIe paths that leave the PCIe switch
# fabric and cross a host bridge (PHB), the interconnect between host bridges of one NUMA node (NODE)
# or the SMP interconnect between NUMA nodes (SYS) are routed through the CPU root complex, where ACS
# and the IOMMU act on peer-to-peer traffic.
HOST_BRIDGE_PATHS = ("PHB", "NODE", "SYS")
SWITCH_PATHS = ("PIX", "PXB")

_VERSION_RE = re.compile(r"(\d+(?:\.\d+)+)")
_NVRM_RE = re.compile(r"^NVRM version:\s*(?P<text>.*)$", re.MULTILINE)


class ParseError(ValueError):
    """Text that does not have the recorded shape."""


def parse_version(text):
    """'580.126.09' -> (580, 126, 9); raises ParseError when there is no dotted number."""
    match = _VERSION_RE.search(text or "")
    if not match:
        if text and text.strip().isdigit():
            return (int(text.strip()),)
        raise ParseError(f"no version number in {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _value(raw):
    raw = raw.strip()
    return None if raw in NOT_AVAILABLE else raw


def parse_query_csv(text, fields=QUERY_FIELDS):
    """Rows of `--format=csv,noheader,nounits` -> list of GPU dicts (keys: GPU_KEYS)."""
    if tuple(fields) != QUERY_FIELDS:
        raise ParseError("parse_query_csv only knows the QUERY_FIELDS order")
    gpus = []
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    for lineno, row in enumerate(reader, start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(fields):
            raise ParseError(
                f"line {lineno}: {len(row)} fields, expected {len(fields)} ({','.join(fields)}): {row!r}"
            )
        values = [_value(cell) for cell in row]
        gpu = dict(zip(GPU_KEYS, values))
        try:
            gpu["index"] = int(gpu["index"])
        except (TypeError, ValueError) as exc:
            raise ParseError(f"line {lineno}: index {row[0]!r} is not a number") from exc
        if gpu["memory_total_mib"] is not None:
            try:
                gpu["memory_total_mib"] = int(gpu["memory_total_mib"])
            except ValueError as exc:
                raise ParseError(
                    f"line {lineno}: memory.total {row[5]!r} is not a number (was nounits given?)"
                ) from exc
        gpus.append(gpu)
    return gpus


def parse_topology(text):
    """`nvidia-smi topo -m` -> {'devices': [...], 'gpus': [...], 'matrix': {row: {col: type}}}.

    The header names the device columns (GPU0.., NIC0.. or mlx5_0..) and then the affinity columns
    ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID"); rows start with a device name.  Cells are
    whitespace separated tokens (tabs in the raw output, spaces when copied from a terminal).
    Parsing stops at the "Legend:" block.
    """
    lines = [line.rstrip() for line in (text or "").splitlines()]
    header = None
    matrix = {}
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Legend"):
            break
        tokens = stripped.split()
        if header is None:
            if tokens and re.fullmatch(r"GPU\d+", tokens[0]):
                header = tokens[: tokens.index("CPU")] if "CPU" in tokens else tokens
                header = [t for t in header if not t.startswith("NUMA")]
            continue
        name = tokens[0]
        if name not in header:
            continue
        cells = tokens[1 : 1 + len(header)]
        if len(cells) != len(header):
            raise ParseError(f"topology row {name}: {len(cells)} cells for {len(header)} devices")
        matrix[name] = dict(zip(header, cells))
    if header is None:
        raise ParseError('no "GPU0 ..." header line in nvidia-smi topo -m output')
    gpus = [d for d in header if re.fullmatch(r"GPU\d+", d)]
    missing = [g for g in gpus if g not in matrix]
    if missing:
        raise ParseError(f"topology has no row for {', '.join(missing)}")
    return {"devices": header, "gpus": gpus, "matrix": matrix}


def gpu_pairs(topology):
    """[(gpuA, gpuB, connection type)] for each unordered GPU pair."""
    gpus = topology["gpus"]
    pairs = []
    for i, left in enumerate(gpus):
        for right in gpus[i + 1 :]:
            pairs.append((left, right, topology["matrix"][left][right]))
    return pairs


def parse_driver_version_file(text):
    """/proc/driver/nvidia/version -> {'flavour': 'open'|'proprietary'|'unknown', 'version', 'nvrm'}."""
    match = _NVRM_RE.search(text or "")
    if not match:
        return {"flavour": "unknown", "version": None, "nvrm": None}
    nvrm = match.group("text").strip()
    if "Open Kernel Module" in nvrm:
        flavour = "open"
    elif "Kernel Module" in nvrm:
        flavour = "proprietary"
    else:
        flavour = "unknown"
    version_match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", nvrm)
    return {"flavour": flavour, "version": version_match.group(1) if version_match else None, "nvrm": nvrm}


def iommu_state(cmdline, group_count):
    """IOMMU mode from the kernel command line and the number of /sys/kernel/iommu_groups entries.

    'off'         the kernel was told to disable it (iommu=off, intel_iommu=off, amd_iommu=off) or
                  there are no IOMMU groups at all;
    'passthrough' iommu=pt (DMA of host devices is not translated);
    'translated'  IOMMU groups exist and nothing turns translation off: DMA remapping is active.
    """
    params = {}
    for token in (cmdline or "").split():
        key, _, value = token.partition("=")
        params[key] = value
    names = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough")
    settings = {k: params[k] for k in names if k in params}
    if params.get("iommu") == "off" or "off" in (params.get("intel_iommu"), params.get("amd_iommu")):
        mode = "off"
    elif params.get("iommu") == "pt" or params.get("iommu.passthrough") == "1":
        mode = "passthrough"
    elif group_count > 0:
        mode = "translated"
    else:
        mode = "off"
    return {"mode": mode, "groups": group_count, "cmdline_settings": settings}


def assess_nccl_p2p_risk(topology, iommu):
    """Known NCCL P2P hang conditions on PCIe GPUs without NVLink (RTX PRO 6000 Blackwell).

    Returns {'risk': bool, 'reasons': [...], 'host_bridge_pairs': [...]}.  Sources (docs/gpu-hosts.md):
    NCCL troubleshooting ("PCI Access Control Services"), NVIDIA/nccl#1999 and
    local-inference-lab/rtx6kpro#15 (AllReduce hangs with P2P on RTX PRO 6000 over PHB),
    NVIDIA/nccl#2079 (ACS redirect on root ports: hang until ACS was disabled).
    """
    reasons = []
    pairs = gpu_pairs(topology)
    host_bridge = [f"{a}-{b}:{kind}" for a, b, kind in pairs if kind in HOST_BRIDGE_PATHS]
    over_pcie = [(a, b, kind) for a, b, kind in pairs if kind in HOST_BRIDGE_PATHS + SWITCH_PATHS]
    if host_bridge:
        kinds = "/".join(sorted({p.rsplit(":", 1)[1] for p in host_bridge}))
        reasons.append(
            f"{len(host_bridge)} GPU pair(s) reach each other through the CPU root complex "
            f"({kinds}); NCCL AllReduce hangs with P2P "
            "over such paths were reported on RTX PRO 6000 Blackwell (NVIDIA/nccl#1999, rtx6kpro#15)"
        )
    if over_pcie and iommu["mode"] == "translated":
        reasons.append(
            f"IOMMU DMA translation is active ({iommu['groups']} IOMMU groups, no iommu=pt on the kernel "
            "command line): with ACS redirect, PCIe P2P goes through the IOMMU and NCCL can hang "
            '(NCCL troubleshooting "PCI Access Control Services"; check `lspci -vvv | grep ACSCtl`)'
        )
    return {"risk": bool(reasons), "reasons": reasons, "host_bridge_pairs": host_bridge}
