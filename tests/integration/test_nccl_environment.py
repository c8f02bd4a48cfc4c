"""The NCCL peer-to-peer decision reaches the RUNNING server (issue 18, item 6), on the shared lab host.

`nvidia_nccl_p2p_disable: true` (the inventory's decision, docs/gpu-hosts.md; here as an extra var) makes
the sglang role write NCCL_P2P_DISABLE=1 into the environment file and restart; the verification reads it
from /proc/<MainPID>/environ of the new invocation and records where it read it. The baseline deploy
(no decision) afterwards restarts without it.
"""

from __future__ import annotations

ENV_PATH = "/etc/sglang/sglang.env"
# playbooks/sglang.yml only: the GPU play is off on lab hosts and the weights play would change nothing.
SGLANG_PLAYBOOK = "playbooks/sglang.yml"
FAST_VERIFY = {"sglang_stable_seconds": 3, "sglang_health_count": 2}


def environ(lab_host, pid: int) -> dict[str, str]:
    raw = lab_host.read_bytes(f"/proc/{pid}/environ").decode("utf-8")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def test_nccl_p2p_disable_is_read_from_the_running_process(lab_host):
    before = lab_host.state()
    try:
        decided = {**FAST_VERIFY, "nvidia_nccl_p2p_disable": True}
        r = lab_host.playbook("-e", "window=2048", extra=decided, playbook=SGLANG_PLAYBOOK)
        assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]
        after = lab_host.state()
        assert after.invocation_id != before.invocation_id and after.env_sha256 != before.env_sha256
        assert 'NCCL_P2P_DISABLE="1"' in lab_host.read_bytes(ENV_PATH).decode().splitlines()
        assert environ(lab_host, after.main_pid).get("NCCL_P2P_DISABLE") == "1"
        record = lab_host.history()[-1]
        assert record["result"] == "verified" and record["invocation_id"] == after.invocation_id
        assert record["env"]["NCCL_P2P_DISABLE"] == "1"
        assert record["read_from"]["NCCL_P2P_DISABLE"] == [f"/proc/{after.main_pid}/environ"]
    finally:
        lab_host.restore_baseline()
    restored = lab_host.state()
    assert "NCCL_P2P_DISABLE" not in environ(lab_host, restored.main_pid)
