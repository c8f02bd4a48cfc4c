"""library/sglang_host_probe.py: real main() on real files, directories and accounts (tmp_path, this
machine's passwd/group); the answers of ``dpkg-query`` and ``systemctl show`` are recorded real outputs
(tests/fixtures/host_probe/*.json with the command they answer, see SOURCE.md), and so are the SGLang
dist-info METADATA and the install marker the probe reads."""

from __future__ import annotations

import contextlib
import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_release import release_key
from ansible.module_utils.sglang_systemd import parse_show
from conftest import FIXTURES, load_module

RECORDED = FIXTURES / "host_probe"
HISTORY_CLI = b'#!/usr/bin/python3\nprint("history")\n'
SHA1 = hashlib.sha1(HISTORY_CLI).hexdigest()
ME = pwd.getpwuid(os.geteuid())
MY_GROUP = grp.getgrgid(os.getegid()).gr_name
# An account that exists and owns none of the test's files.
OTHER = "nobody" if ME.pw_name != "nobody" else "root"
OTHER_GROUP = "nogroup" if MY_GROUP != "nogroup" else "root"
OTHER_SHELL = "/usr/sbin/nologin" if ME.pw_shell != "/usr/sbin/nologin" else "/bin/sh"
ABSENT = "sglang-probe-test-absent"


def recorded(name):
    return json.loads((RECORDED / name).read_text())


@pytest.fixture
def host(monkeypatch):
    """fake_host: the recorded host."""
    return fake_host(monkeypatch)


def fake_host(monkeypatch):
    """Answers dpkg-query and systemctl from the recordings chosen in ``host['dpkg']`` / ``host['show']``,
    after checking that the module runs exactly the recorded command; ``host['warned']``: its warnings."""
    state = {
        "dpkg": "dpkg-controller-role-packages.json",
        "show": "show-lab-running.json",
        "calls": [],
        "warned": [],
    }

    def fake(self, cmd, **kwargs):
        name = os.path.basename(cmd[0])
        state["calls"].append(name)
        assert kwargs.get("environ_update", {}).get("LANG") == "C", kwargs
        rec = recorded(state["dpkg"] if name == "dpkg-query" else state["show"])
        assert [name, *cmd[1:]] == rec["argv"], f"the module ran {cmd}, the recording answers {rec['argv']}"
        return rec["rc"], rec["stdout"], rec["stderr"]

    monkeypatch.setattr(AnsibleModule, "run_command", fake)
    # Where a warning ends up (the result or stderr) depends on ansible-core's global state: collect them.
    monkeypatch.setattr(AnsibleModule, "warn", lambda self, text: state["warned"].append(text))
    monkeypatch.setattr(
        AnsibleModule,
        "get_bin_path",
        lambda self, name, required=False, opt_dirs=None: shutil.which(name) or f"/usr/bin/{name}",
    )
    return state


def want(root):
    """What the role asks for (roles/sglang/vars/main.yml __sglang_probe_want), under ``root``."""
    mine = {"owner": ME.pw_name, "group": MY_GROUP}
    return {
        "venv": str(root / "venv"),
        "marker": str(root / "venv" / "sglang-deploy-install.json"),
        "packages": ["python3-venv", "rsync", "git"],
        "dirs": [
            {"path": str(root / "etc"), **mine, "mode": "0755"},
            {"path": str(root / "state"), **mine, "mode": "0750"},
            {"path": str(root / "state" / "known-good"), **mine, "mode": "0700"},
        ],
        "user_dirs": [str(root / "home"), str(root / "home" / ".cache")],
        "user_dir_mode": "0750",
        "user": {
            "name": ME.pw_name,
            "group": grp.getgrgid(ME.pw_gid).gr_name,
            "home": ME.pw_dir,
            "shell": ME.pw_shell,
        },
        "files": [{"path": str(root / "bin" / "sglang-history"), "sha1": SHA1, "mode": "0755", **mine}],
        "unit": "sglang.service",
        "sha256": {
            "unit": str(root / "etc" / "sglang.service"),
            "env": str(root / "etc" / "sglang.env"),
            "known_good_unit": str(root / "state" / "known-good" / "sglang.service"),
        },
        "modes": {
            "unit": {"path": str(root / "etc" / "sglang.service"), "mode": "0644", **mine},
            "env": {"path": str(root / "etc" / "sglang.env"), "mode": "0600", **mine},
        },
        # Two unit directories (as /etc/systemd/system and /run/systemd/system), never this machine's.
        "dropin_dirs": [str(root / "etc-systemd"), str(root / "run-systemd")],
    }


def make_dir(path, mode):
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)


def make_file(path, data, mode):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def build_good_host(root):
    """Everything ``want(root)`` asks for, the venv holding the recorded SGLang 0.5.23 METADATA."""
    site = root / "venv" / "lib" / "python3.11" / "site-packages"
    make_file(root / "venv" / "bin" / "python", b"", 0o755)
    metadata = (RECORDED / "sglang-0.5.23.METADATA").read_bytes()
    make_file(site / "sglang-0.5.23.dist-info" / "METADATA", metadata, 0o644)
    marker = (RECORDED / "marker-lab.json").read_bytes()
    make_file(root / "venv" / "sglang-deploy-install.json", marker, 0o644)
    make_dir(root / "etc", 0o755)
    make_dir(root / "state", 0o750)
    make_dir(root / "state" / "known-good", 0o700)
    make_dir(root / "home", 0o750)
    make_dir(root / "home" / ".cache", 0o750)
    make_file(root / "bin" / "sglang-history", HISTORY_CLI, 0o755)
    make_file(root / "etc" / "sglang.service", b"[Service]\nExecStart=/bin/true\n", 0o644)
    make_file(root / "etc" / "sglang.env", b"HF_HOME=/var/lib/sglang/.cache/huggingface\n", 0o600)
    shutil.copy(root / "etc" / "sglang.service", root / "state" / "known-good" / "sglang.service")


def release_beside_venv(root):
    """build_good_host's venv copied as the release the recorded marker wants, keyed by this interpreter's
    major.minor: (its path, its key, major.minor, the wanted marker, the probe's release option)."""
    wanted = recorded("marker-lab.json")
    version = "{}.{}".format(*sys.version_info[:2])
    key = release_key(wanted, version)
    release = root / "releases" / key
    shutil.copytree(root / "venv", release)
    spec = {
        "dir": str(root / "releases"),
        "wanted": wanted,
        "python": os.path.realpath(sys.executable),
        "marker_name": "sglang-deploy-install.json",
    }
    return release, key, version, wanted, spec


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_nothing_installed_yet(run_module, host, tmp_path):
    """A fresh host: no venv, marker, directories, account, files or unit; none of the packages."""
    host["dpkg"] = "dpkg-lab-removed.json"
    host["show"] = "show-lab-not-found.json"
    args = want(tmp_path)
    args["user"] = {"name": ABSENT, "group": ABSENT, "home": str(tmp_path / "home"), "shell": OTHER_SHELL}
    with pytest.raises(KeyError):
        pwd.getpwnam(ABSENT)
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    probe = {k: v for k, v in result.items() if k != "invocation"}
    assert probe == {
        "changed": False,
        "venv": False,
        "versions": [],
        "marker": None,
        "release": None,
        "linked_dirs": [],
        "missing_packages": ["python3-venv", "rsync", "git"],
        "bad_dirs": [d["path"] for d in args["dirs"]] + args["user_dirs"],
        "group_ok": False,
        "user_ok": False,
        "bad_files": [args["files"][0]["path"]],
        "sha256": {"unit": None, "env": None, "known_good_unit": None},
        "modes_ok": {"unit": False, "env": False},
        "systemd": parse_show(recorded("show-lab-not-found.json")["stdout"]),
        "dropins": [],
        "pending": None,
    }
    assert probe["systemd"]["LoadState"] == "not-found"


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check_mode"])
def test_everything_as_wanted(run_module, host, tmp_path, check_mode):
    build_good_host(tmp_path)
    before = sorted((str(p), p.stat().st_mode, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    result, failed = run_module("sglang_host_probe", {**want(tmp_path), "_ansible_check_mode": check_mode})
    assert not failed, result
    assert result["changed"] is False
    assert result["venv"] is True
    assert result["versions"] == ["0.5.23"]
    assert result["marker"] == recorded("marker-lab.json")
    assert result["missing_packages"] == []
    assert result["bad_dirs"] == [] and result["bad_files"] == []
    assert result["group_ok"] is True and result["user_ok"] is True
    assert result["sha256"] == {
        "unit": sha256(tmp_path / "etc" / "sglang.service"),
        "env": sha256(tmp_path / "etc" / "sglang.env"),
        "known_good_unit": sha256(tmp_path / "etc" / "sglang.service"),
    }
    assert result["modes_ok"] == {"unit": True, "env": True}
    assert result["systemd"] == parse_show(recorded("show-lab-running.json")["stdout"])
    assert result["systemd"]["LoadState"] == "loaded" and result["systemd"]["UnitFileState"] == "enabled"
    assert sorted(host["calls"]) == ["dpkg-query", "systemctl"] and host["warned"] == []
    assert result["systemd"]["DropInPaths"] == "" and result["dropins"] == []
    assert sorted((str(p), p.stat().st_mode, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


def test_release_the_settings_want_is_found_by_its_key_and_complete_only_with_its_marker(
    run_module, host, tmp_path
):
    """With ``release`` the probe takes the system Python's major.minor (its own when it runs under that
    interpreter, as here; else it asks it), keys the release by it and the wanted install, and probes that
    directory; a directory whose marker does not name the key (an interrupted build) is not complete."""
    build_good_host(tmp_path)
    release, key, version, wanted, spec = release_beside_venv(tmp_path)
    args = {**want(tmp_path), "release": spec}
    del args["venv"], args["marker"]
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    assert result["release"]["key"] == key and key.startswith(f"0.5.23-py{version}-")
    assert result["release"]["path"] == str(release) and result["release"]["complete"] is False
    assert result["venv"] is True and result["versions"] == ["0.5.23"]
    (release / "sglang-deploy-install.json").write_text(json.dumps(dict(wanted, release=key, python=version)))
    result, failed = run_module("sglang_host_probe", args)
    assert not failed and result["release"]["complete"] is True, result
    assert result["release"]["marker_sha256"] == sha256(release / "sglang-deploy-install.json")
    assert result["release"]["entries"] == [key]
    # Another dependency set is another release, not this one.
    other = dict(wanted, dependencies=dict(wanted["dependencies"], resolved_by_pip=True))
    result, failed = run_module("sglang_host_probe", dict(args, release=dict(spec, wanted=other)))
    assert not failed and result["release"]["key"] != key and result["release"]["exists"] is False
    result, failed = run_module(
        "sglang_host_probe", dict(args, release=dict(spec, python=str(tmp_path / "no")))
    )
    assert failed and "the Python SGLang releases are made with" in result["msg"]
    # Another interpreter is asked.
    other_python = tmp_path / "python3.99"
    other_python.write_text("#!/bin/sh\necho 3.99\n")
    other_python.chmod(0o755)
    result, failed = run_module("sglang_host_probe", dict(args, release=dict(spec, python=str(other_python))))
    assert not failed and result["release"]["key"].startswith("0.5.23-py3.99-"), result


def test_release_tidy_only_when_the_releases_module_would_change_nothing(run_module, host, tmp_path):
    """``release.tidy`` (tasks/main.yml skips sglang_releases on it): the link points at the wanted release
    and keeping ``keep`` releases removes nothing; a wrong link, one release too many, an interrupted build
    or an interrupted removal each make it false."""
    build_good_host(tmp_path)
    wanted = recorded("marker-lab.json")
    version = "{}.{}".format(*sys.version_info[:2])
    key = release_key(wanted, version)
    releases = tmp_path / "releases"
    marker = "sglang-deploy-install.json"

    def make(name):
        (releases / name).mkdir(parents=True)
        (releases / name / marker).write_text(json.dumps(dict(wanted, release=name, python=version)))

    make(key)
    link = tmp_path / "venv-link"
    spec = {
        "dir": str(releases),
        "wanted": wanted,
        "python": os.path.realpath(sys.executable),
        "marker_name": marker,
        "keep": 2,
        "link": str(link),
    }
    args = {**want(tmp_path), "release": spec}
    del args["venv"], args["marker"]

    def tidy():
        result, failed = run_module("sglang_host_probe", args)
        assert not failed, result
        return result["release"]["tidy"]

    assert tidy() is False  # no link yet
    link.symlink_to(releases / key)
    assert tidy() is True
    make("0.5.22-py3.11-aaaaaaaaaaaa")
    assert tidy() is True  # 2 complete releases, keep 2
    make("0.5.21-py3.11-bbbbbbbbbbbb")
    assert tidy() is False  # one beyond keep
    shutil.rmtree(releases / "0.5.21-py3.11-bbbbbbbbbbbb")
    (releases / "0.6.0-py3.11-cccccccccccc").mkdir()  # no marker: an interrupted build
    assert tidy() is False
    (releases / "0.6.0-py3.11-cccccccccccc").rename(releases / ".removing-0.6.0")
    assert tidy() is False  # an interrupted removal
    shutil.rmtree(releases / ".removing-0.6.0")
    link.unlink()
    link.symlink_to(releases / "0.5.22-py3.11-aaaaaaaaaaaa")
    assert tidy() is False  # the link points at another release
    result, failed = run_module(
        "sglang_host_probe", dict(args, release={k: v for k, v in spec.items() if k != "link"})
    )
    assert not failed and "tidy" not in result["release"], result
    # A releases directory this account cannot list (here: not a directory) is not tidy, never a failure.
    (tmp_path / "not-a-dir").write_text("")
    args["release"] = dict(spec, dir=str(tmp_path / "not-a-dir"))
    assert tidy() is False


def test_a_release_is_running_when_the_mainpid_was_started_from_it():
    """``release.running`` (install.yml refuses to rebuild such a release): argv[0] of MainPID - here this
    test's own process - lies in the release directory."""
    probe = load_module("sglang_host_probe")
    argv0 = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    assert probe.runs_from(str(os.getpid()), os.path.dirname(argv0)) is True
    assert probe.runs_from(str(os.getpid()), os.path.dirname(argv0) + "-other") is False
    assert probe.runs_from("0", os.path.dirname(argv0)) is False and probe.runs_from("", "/") is False


def test_packages_listed_out_of_order_and_unknown_ones(run_module, host, tmp_path):
    """dpkg-query lists in its own order and names an unknown package only on stderr (rc 1)."""
    build_good_host(tmp_path)
    host["dpkg"] = "dpkg-controller-python3-rsync-nonexistent.json"
    args = {**want(tmp_path), "packages": ["python3", "rsync", "nonexistent-pkg"]}
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    assert result["missing_packages"] == ["nonexistent-pkg"]
    assert host["warned"] == []


def test_wrong_mode_owner_content_and_account(run_module, host, tmp_path):
    build_good_host(tmp_path)
    args = want(tmp_path)
    (tmp_path / "etc").chmod(0o775)  # group-writable configuration directory
    args["dirs"][2]["owner"] = OTHER  # known-good owned by someone else than the role wants
    (tmp_path / "home" / ".cache").chmod(0o755)
    (tmp_path / "etc" / "sglang.env").chmod(0o644)  # the secret readable by every local user
    args["modes"]["unit"]["group"] = OTHER_GROUP
    (tmp_path / "bin" / "sglang-history").write_bytes(HISTORY_CLI + b"# edited\n")
    args["user"]["shell"] = OTHER_SHELL
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    assert result["bad_dirs"] == [
        str(tmp_path / "etc"),
        str(tmp_path / "state" / "known-good"),
        str(tmp_path / "home" / ".cache"),
    ]
    assert result["modes_ok"] == {"unit": False, "env": False}
    assert result["bad_files"] == [str(tmp_path / "bin" / "sglang-history")]
    assert result["group_ok"] is True and result["user_ok"] is False
    # The hashes are of what is on disk, whatever the mode.
    assert result["sha256"]["env"] == sha256(tmp_path / "etc" / "sglang.env")


def test_a_symlink_is_neither_a_directory_nor_a_file(run_module, host, tmp_path):
    build_good_host(tmp_path)
    (tmp_path / "real-cache").mkdir(mode=0o750)
    (tmp_path / "real-cache").chmod(0o750)
    (tmp_path / "home" / ".cache").rmdir()
    (tmp_path / "home" / ".cache").symlink_to(tmp_path / "real-cache")
    (tmp_path / "real-history").write_bytes(HISTORY_CLI)
    (tmp_path / "real-history").chmod(0o755)
    (tmp_path / "bin" / "sglang-history").unlink()
    (tmp_path / "bin" / "sglang-history").symlink_to(tmp_path / "real-history")
    (tmp_path / "etc" / "sglang.env").rename(tmp_path / "real-env")
    (tmp_path / "etc" / "sglang.env").symlink_to(tmp_path / "real-env")
    result, failed = run_module("sglang_host_probe", want(tmp_path))
    assert not failed, result
    assert result["bad_dirs"] == [str(tmp_path / "home" / ".cache")]
    assert result["bad_files"] == [str(tmp_path / "bin" / "sglang-history")]
    assert result["modes_ok"] == {"unit": True, "env": False}
    # The hash is of the content it points to: the modes check is what refuses the link.
    assert result["sha256"]["env"] == sha256(tmp_path / "real-env")


def test_a_link_the_service_account_planted_in_its_home_is_reported(run_module, host, tmp_path):
    """The service account owns its home: a link it plants there (~/.cache -> a root-owned directory) must
    never be followed by root; every user directory reached through it is named (linked_dirs)."""
    build_good_host(tmp_path)
    (tmp_path / "root-owned").mkdir(mode=0o755)
    (tmp_path / "home" / ".cache").rmdir()
    (tmp_path / "home" / ".cache").symlink_to(tmp_path / "root-owned")
    args = want(tmp_path)
    hf = str(tmp_path / "home" / ".cache" / "huggingface")
    args["user_dirs"].append(hf)
    args["user"] = dict(args["user"], home=str(tmp_path / "home"))
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    assert result["linked_dirs"] == [str(tmp_path / "home" / ".cache"), hf]
    # A refusal of the decision, naming them, before anything changes.
    args["decide"] = {"want": {}, "mode": {}}
    result, failed = run_module("sglang_host_probe", args)
    assert failed and hf in result["msg"] and "symbolic link" in result["msg"], result


@pytest.fixture
def traversable_tmp(tmp_path):
    """tmp_path, or as root a directory an unprivileged account can reach (tmp_path's parents are 0700)."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="host-probe-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


@contextlib.contextmanager
def without_root():
    """Run as an account that cannot read a 0000 file: as root, effective uid/gid nobody for the block."""
    if os.geteuid() != 0:
        yield
        return
    nobody = pwd.getpwnam("nobody")
    os.setegid(nobody.pw_gid)
    os.seteuid(nobody.pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_what_it_cannot_read_is_not_good_and_no_error(run_module, host, traversable_tmp):
    """A plan run as another account (playbooks/plan.yml): the mode of a file is still seen, its content
    not; a directory inside one it cannot search is bad; nothing fails."""
    root = traversable_tmp
    build_good_host(root)
    args = want(root)
    for name in (
        "venv/sglang-deploy-install.json",
        "etc/sglang.env",
        "bin/sglang-history",
        "venv/lib/python3.11/site-packages/sglang-0.5.23.dist-info/METADATA",
    ):
        (root / name).chmod(0o000)
    (root / "state").chmod(0o000)
    args["dirs"][1]["mode"] = "0000"
    # The home reachable by the account the module runs as (as root: nobody), so that only state/ is not.
    args["user_dir_mode"] = "0755"
    (root / "home").chmod(0o755)
    (root / "home" / ".cache").chmod(0o755)
    args["modes"]["env"]["mode"] = "0000"
    args["files"][0]["mode"] = "0000"
    try:
        with without_root():
            result, failed = run_module("sglang_host_probe", args)
    finally:
        (root / "state").chmod(0o750)
    assert not failed, result
    assert result["venv"] is True
    assert result["versions"] == []
    assert result["marker"] is None
    assert result["bad_dirs"] == [str(root / "state" / "known-good")]
    assert result["bad_files"] == [str(root / "bin" / "sglang-history")]
    assert result["sha256"] == {
        "unit": sha256(root / "etc" / "sglang.service"),
        "env": None,
        "known_good_unit": None,
    }
    assert result["modes_ok"] == {"unit": True, "env": True}
    assert host["warned"] == []


def test_missing_unit(run_module, host, tmp_path):
    """Everything installed, the unit not (yet): systemd's own answer, LoadState=not-found."""
    build_good_host(tmp_path)
    host["show"] = "show-lab-not-found.json"
    result, failed = run_module("sglang_host_probe", want(tmp_path))
    assert not failed, result
    assert result["systemd"] == parse_show(recorded("show-lab-not-found.json")["stdout"])
    assert result["systemd"]["LoadState"] == "not-found" and result["systemd"]["UnitFileState"] == ""
    assert result["bad_dirs"] == [] and result["bad_files"] == [] and result["missing_packages"] == []


def test_systemctl_that_cannot_answer_leaves_the_state_unknown_with_a_warning(run_module, host, tmp_path):
    build_good_host(tmp_path)
    host["show"] = "show-controller-no-systemd.json"
    result, failed = run_module("sglang_host_probe", want(tmp_path))
    assert not failed, result
    assert result["systemd"] == {}
    assert len(host["warned"]) == 1 and "Failed to connect to bus" in host["warned"][0], host["warned"]


@pytest.mark.parametrize("where", ["dirs", "user_dir_mode", "files", "modes"])
def test_a_mode_that_is_not_an_octal_string_is_refused(run_module, host, tmp_path, where):
    """YAML reads an unquoted 0644 as the number 420: refused rather than read as the mode 0420."""
    args = want(tmp_path)
    if where == "dirs":
        args["dirs"][0]["mode"] = 420
    elif where == "user_dir_mode":
        args["user_dir_mode"] = 488
    elif where == "files":
        args["files"][0]["mode"] = "0x755"
    else:
        args["modes"]["env"]["mode"] = 384
    result, failed = run_module("sglang_host_probe", args)
    assert failed, result
    assert "octal string" in result["msg"], result["msg"]
    assert host["calls"] == []


# ---- drop-ins ------------------------------------------------------------------------------------
# override.conf: the drop-in written on lab210 for the recordings (SOURCE.md), copied from the host.
OVERRIDE = (RECORDED / "override.conf").read_bytes()
TOKEN = "hf_dropinRecordedNotARealToken"


def test_a_loaded_dropin_is_reported_from_systemds_dropinpaths(run_module, host, tmp_path):
    """systemctl show after daemon-reload lists the drop-in (DropInPaths); the file itself is not on this
    machine (the path is the host's), so it is reported loaded, not on disk, content unknown."""
    build_good_host(tmp_path)
    host["show"] = "show-lab-dropin.json"
    result, failed = run_module("sglang_host_probe", want(tmp_path))
    assert not failed, result
    path = "/etc/systemd/system/sglang.service.d/override.conf"
    assert result["systemd"]["DropInPaths"] == path
    assert not os.path.lexists(path), "this test needs a machine without that drop-in"
    assert result["dropins"] == [
        {"path": path, "loaded": True, "on_disk": False, "shared": False, "lines": None, "sha256": None}
    ]


def test_a_dropin_on_disk_that_systemd_has_not_loaded_is_reported_with_its_lines_redacted(
    run_module, host, tmp_path
):
    """Written without daemon-reload, systemd 252 shows NO drop-in and NeedDaemonReload=no (recorded):
    only the scan of the unit directories finds it. Comments are skipped, the token is masked."""
    build_good_host(tmp_path)
    host["show"] = "show-lab-dropin-pending.json"
    shown = parse_show(recorded("show-lab-dropin-pending.json")["stdout"])
    assert shown["DropInPaths"] == "" and shown["NeedDaemonReload"] == "no"
    make_file(tmp_path / "run-systemd" / "sglang.service.d" / "override.conf", OVERRIDE, 0o644)
    # Not drop-ins of sglang.service: another unit's, and a file without .conf.
    make_file(tmp_path / "etc-systemd" / "other.service.d" / "x.conf", OVERRIDE, 0o644)
    make_file(tmp_path / "etc-systemd" / "sglang.service.d" / "notes.txt", OVERRIDE, 0o644)
    result, failed = run_module("sglang_host_probe", want(tmp_path))
    assert not failed, result
    assert result["dropins"] == [
        {
            "path": str(tmp_path / "run-systemd" / "sglang.service.d" / "override.conf"),
            "loaded": False,
            "on_disk": True,
            "shared": False,
            "lines": ["[Service]", "User=root", "Environment=HF_TOKEN=<redacted>"],
            "sha256": hashlib.sha256(OVERRIDE).hexdigest(),
        }
    ]
    assert TOKEN in OVERRIDE.decode() and TOKEN not in json.dumps(result)


def test_shared_dropins_of_the_type_are_reported_as_shared_and_a_merged_dir_counts_once(
    run_module, host, tmp_path
):
    """service.d applies to every service: reported shared (the role never removes it). /lib and /usr/lib
    being one directory (merged /usr): each drop-in once."""
    build_good_host(tmp_path)
    make_file(tmp_path / "etc-systemd" / "service.d" / "10-x.conf", OVERRIDE, 0o644)
    make_file(tmp_path / "etc-systemd" / "sglang.service.d" / "override.conf", OVERRIDE, 0o644)
    (tmp_path / "run-systemd").symlink_to(tmp_path / "etc-systemd")
    result, failed = run_module("sglang_host_probe", dict(want(tmp_path), dropin_lines=1))
    assert not failed, result
    got = [
        (Path(d["path"]).relative_to(tmp_path).as_posix(), d["shared"], d["lines"]) for d in result["dropins"]
    ]
    assert got == [
        ("etc-systemd/service.d/10-x.conf", True, ["[Service]", "..."]),
        ("etc-systemd/sglang.service.d/override.conf", False, ["[Service]", "..."]),
    ]


def test_dropin_directory_names_of_a_dashed_unit():
    """systemd.unit(5) "drop-in": foo-bar-baz.service reads foo-bar-.service.d, foo-.service.d, service.d."""
    probe = load_module("sglang_host_probe")
    assert probe.dropin_dir_names("sglang-k26-ddtree.service") == [
        ("sglang-k26-ddtree.service.d", False),
        ("sglang-k26-.service.d", True),
        ("sglang-.service.d", True),
        ("service.d", True),
    ]
    assert probe.dropin_dir_names("sglang.service") == [("sglang.service.d", False), ("service.d", True)]


def test_a_pending_marker_left_by_an_interrupted_run_is_reported(run_module, host, tmp_path):
    """What sglang_unit wrote before the files (P19); none, or none asked for: null; not JSON: unreadable;
    no regular file: unreadable and not_a_file."""
    build_good_host(tmp_path)
    marker = tmp_path / "state" / "sglang.pending.json"
    args = {**want(tmp_path), "pending": str(marker)}
    result, failed = run_module("sglang_host_probe", args)
    assert not failed and result["pending"] is None
    pending = {"unit": "sglang.service", "pid": 77, "files": {"unit": {"path": "/etc/x", "sha256": "ab"}}}
    marker.write_text(json.dumps(pending))
    result, failed = run_module("sglang_host_probe", args)
    assert not failed and result["pending"] == pending
    assert run_module("sglang_host_probe", want(tmp_path))[0]["pending"] is None
    marker.write_text('{"unit": ')
    result, failed = run_module("sglang_host_probe", args)
    assert not failed and result["pending"]["unreadable"].startswith("not JSON")
    assert "not_a_file" not in result["pending"]
    # A directory at the marker's path (made by hand): no regular file, so the role refuses to deploy.
    marker.unlink()
    marker.mkdir()
    result, failed = run_module("sglang_host_probe", args)
    assert not failed and result["pending"] == {"unreadable": "not a regular file", "not_a_file": True}


def test_the_deploy_lock_is_taken_first_in_the_probes_own_call_and_a_held_one_refuses(
    run_module, host, tmp_path
):
    """With lock, the call takes the deploy lock (the same record sglang_lock writes) before it reads the
    host; a second run is refused naming the holder, and probes nothing."""
    build_good_host(tmp_path)
    (tmp_path / "run").mkdir()
    lock = {"name": "sglang", "dir": str(tmp_path / "run" / "sglang-deploy"), "doing": "installing"}
    # The first run's ansible-playbook on this host (a local run): its end is certain death, an sshd's not.
    holder = subprocess.Popen(["ansible-playbook", "60"], executable="/bin/sleep")
    try:
        first, failed = run_module(
            "sglang_host_probe", {**want(tmp_path), "lock": {**lock, "anchor_pid": holder.pid}}
        )
        assert not failed, first
        assert first["versions"] == ["0.5.23"] and first["bad_dirs"] == []  # and it probed
        taken = first["lock"]
        record = json.loads((tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_text())
        assert (
            len(taken["token"]) == 32
            and record["token"] == taken["token"]
            and record["doing"] == "installing"
        )
        assert taken["holder"] == record and "took_over" not in taken

        second, failed = run_module("sglang_host_probe", {**want(tmp_path), "lock": lock})
        assert failed and second["msg"].startswith("another deploy of sglang holds ")
        assert second["holder"]["token"] == taken["token"] and second["lock"]["token"] == ""
        assert "versions" not in second and "systemd" not in second  # refused before reading anything
        assert sorted(host["calls"]) == ["dpkg-query", "systemctl"]  # the first call's only
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone, the lock is taken over (and said so).
    third, failed = run_module("sglang_host_probe", {**want(tmp_path), "lock": lock})
    assert not failed, third
    assert (
        third["lock"]["took_over"]["token"] == taken["token"]
        and "is gone" in third["lock"]["took_over"]["reason"]
    )
    assert any("took over the deploy lock of sglang" in text for text in host["warned"])


def test_a_probe_that_fails_after_taking_the_lock_returns_it_to_be_released(run_module, host, tmp_path):
    build_good_host(tmp_path)
    (tmp_path / "run").mkdir()
    lock = {"name": "sglang", "dir": str(tmp_path / "run" / "sglang-deploy"), "anchor_pid": os.getpid()}
    args = {k: v for k, v in want(tmp_path).items() if k not in ("venv", "marker")}  # neither, nor a release
    result, failed = run_module("sglang_host_probe", {**args, "lock": lock})
    assert failed and result["msg"] == "venv and marker are required without release"
    on_disk = json.loads((tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_text())
    assert result["lock"]["token"] == on_disk["token"]


def test_check_mode_takes_no_lock_and_warns_of_a_deploy_in_progress(run_module, host, tmp_path):
    build_good_host(tmp_path)
    (tmp_path / "run").mkdir()
    lock = {"name": "sglang", "dir": str(tmp_path / "run" / "sglang-deploy"), "anchor_pid": os.getpid()}
    held, failed = run_module("sglang_host_probe", {**want(tmp_path), "lock": lock})
    assert not failed, held
    before = (tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_bytes()
    checked, failed = run_module(
        "sglang_host_probe", {**want(tmp_path), "lock": lock, "_ansible_check_mode": True}
    )
    assert not failed, checked
    assert checked["lock"]["token"] == "" and checked["lock"]["holder"]["token"] == held["lock"]["token"]
    assert any("sglang is being deployed now by" in text for text in host["warned"])
    assert (tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_bytes() == before
    assert checked["versions"] == ["0.5.23"]  # and it probed


CAPS_0523 = json.loads((FIXTURES / "capabilities" / "sglang-0.5.23.json").read_text())
DFLASH = {
    "model_path": "/srv/models/target",
    "speculative_algorithm": "DFLASH",
    "speculative_draft_model_path": "/srv/models/draft",
    "speculative_draft_window_size": 2048,
}


def test_the_command_line_is_built_in_the_probes_call_only_for_a_complete_release(
    run_module, host, tmp_path, monkeypatch
):
    """With argv, a complete release gets sglang_argv's very result (flags asked of the release's own Python,
    the recorded 0.5.23 parser dump standing for the cache); an incomplete one gets null (built after the
    install); a bad setting fails the probe naming it, and returns the lock it took, to be released."""
    from ansible.module_utils import sglang_argv_run

    asked = []

    def discover(module, python, cache_dir, timeout, cache_files=None):
        asked.append(python)
        return CAPS_0523, True, os.path.join(cache_dir, "x.json"), {}

    monkeypatch.setattr(sglang_argv_run, "discover", discover)
    build_good_host(tmp_path)
    release, key, version, wanted, spec = release_beside_venv(tmp_path)
    argv = {"settings": DFLASH, "cache_dir": str(tmp_path / "caps"), "config_path": "/etc/sglang/sglang.yaml"}
    args = {k: v for k, v in want(tmp_path).items() if k not in ("venv", "marker")}
    args.update(release=spec, argv=argv)
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    assert result["release"]["complete"] is False and result["argv"] is None and asked == []

    (release / "sglang-deploy-install.json").write_text(json.dumps(dict(wanted, release=key, python=version)))
    result, failed = run_module("sglang_host_probe", args)
    assert not failed, result
    assert asked == [str(release / "bin" / "python")]
    alone, failed = run_module("sglang_argv", dict(argv, python=str(release / "bin" / "python")))
    assert not failed, alone
    assert result["argv"] == {k: v for k, v in alone.items() if k not in ("changed", "invocation")}
    flag = result["argv"]["argv"].index("--speculative-draft-window-size")
    assert result["argv"]["argv"][flag + 1] == "2048"

    (tmp_path / "run").mkdir()
    lock = {"name": "sglang", "dir": str(tmp_path / "run" / "sglang-deploy"), "anchor_pid": os.getpid()}
    bad = dict(argv, settings=dict(DFLASH, speculative_ddtree_budget=32))
    result, failed = run_module("sglang_host_probe", dict(args, argv=bad, lock=lock))
    assert failed and result["msg"].startswith(
        "speculative_ddtree_budget: SGLang 0.5.23 has no tree-budget flag"
    )
    on_disk = json.loads((tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_text())
    assert result["lock"]["token"] == on_disk["token"]


def test_the_probe_judges_its_command_line_only_once_the_account_it_parses_as_exists(
    run_module, host, tmp_path, monkeypatch
):
    """A host booted with a complete release but before install.yml made the service account: the probe
    leaves the parse to sglang_preflight after the install (no verdict, so the decision's ``parse`` holds);
    with the account there it judges the command line it built, with the environment that line adds."""
    from ansible.module_utils import sglang_argv_run, sglang_preflight

    judged = []

    def discover(module, python, cache_dir, timeout, cache_files=None):
        return CAPS_0523, True, os.path.join(cache_dir, "x.json"), {"version": "0.5.23"}

    def preflight(module, params, meta=None):
        judged.append((params["argv"], params["env"], params["run_as"], meta))
        return (
            {"version": "0.5.23", "resolved": {"speculative_draft_window_size": 2048}, "warnings": []},
            True,
            [],
        )

    monkeypatch.setattr(sglang_argv_run, "discover", discover)
    monkeypatch.setattr(sglang_preflight, "preflight", preflight)
    build_good_host(tmp_path)
    release, key, version, wanted, spec = release_beside_venv(tmp_path)
    (release / "sglang-deploy-install.json").write_text(json.dumps(dict(wanted, release=key, python=version)))
    argv = {"settings": DFLASH, "cache_dir": str(tmp_path / "caps"), "config_path": "/etc/sglang/sglang.yaml"}
    args = {k: v for k, v in want(tmp_path).items() if k not in ("venv", "marker")}
    args.update(release=spec, argv=argv)

    missing = {"run_as": "sglang-no-such-account", "env": {"HF_HOME": "/h"}}
    result, failed = run_module("sglang_host_probe", dict(args, preflight=missing))
    assert not failed, result
    assert result["argv"] is not None and "preflight" not in result and judged == []

    there = {"run_as": pwd.getpwuid(os.getuid()).pw_name, "env": {"HF_HOME": "/h"}}
    result, failed = run_module("sglang_host_probe", dict(args, preflight=there))
    assert not failed, result
    assert result["preflight"] == {
        "version": "0.5.23",
        "resolved": {"speculative_draft_window_size": 2048},
        "cached": True,
    }
    ((argv_judged, env, run_as, meta),) = judged
    assert argv_judged == result["argv"]["argv"] and run_as == there["run_as"]
    assert env == dict({"HF_HOME": "/h"}, **result["argv"]["env"]) and meta == {"version": "0.5.23"}
