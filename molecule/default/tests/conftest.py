"""The Testinfra `host` of this scenario: Testinfra's paramiko backend, one SSH connection per host.

The hosts are the `--hosts` group of the `--ansible-inventory` that molecule.yml passes (the lab
inventory lab/labctl writes); each is reached with the inventory's own address, user, key
(`ansible_ssh_private_key_file`) and known_hosts (`UserKnownHostsFile=` in `ansible_ssh_common_args`).
Testinfra's paramiko backend alone accepts an unknown host key with a warning: here the key must be
in that known_hosts file or the connection is refused (paramiko's RejectPolicy), as
`StrictHostKeyChecking=yes` does for Ansible. paramiko keeps one transport open for all the checks
instead of one `ssh` process per command (molecule.yml has the measured times).
"""

from __future__ import annotations

import functools
import shlex

import paramiko
import pytest
import testinfra.host
from testinfra.backend.paramiko import ParamikoBackend
from testinfra.utils.ansible_runner import AnsibleRunner


class KnownHostsParamikoBackend(ParamikoBackend):
    """Testinfra's paramiko backend with the host key checked against one known_hosts file."""

    def __init__(self, hostspec: str, known_hosts: str, **kwargs):
        self.known_hosts = known_hosts
        super().__init__(hostspec, **kwargs)

    @functools.cached_property
    def client(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            self.host.name,
            port=int(self.host.port or 22),
            username=self.host.user,
            key_filename=self.ssh_identity_file,
            look_for_keys=False,
            allow_agent=False,
            timeout=self.timeout,
        )
        return client


def ssh_option(common_args: str, name: str) -> str | None:
    """The value of `-o Name=value` (or `-oName=value`) in an ansible_ssh_common_args string."""
    words = shlex.split(common_args)
    for i, word in enumerate(words):
        if word == "-o" and i + 1 < len(words):
            option = words[i + 1]
        else:
            option = word[2:] if word.startswith("-o") else ""
        key, _, value = option.partition("=")
        if key.lower() == name.lower() and value:
            return value
    return None


def paramiko_host(inventory: str, name: str) -> testinfra.host.Host:
    hostvars = AnsibleRunner.get_runner(inventory).get_variables(name)

    def setting(key: str) -> str:
        value = hostvars.get(key)
        if not value:
            pytest.fail(f"{inventory}: host {name} has no {key}: the paramiko connection needs it")
        return str(value)

    known_hosts = ssh_option(hostvars.get("ansible_ssh_common_args", ""), "UserKnownHostsFile")
    if not known_hosts:
        pytest.fail(
            f"{inventory}: host {name}: ansible_ssh_common_args has no -o UserKnownHostsFile=: "
            "the paramiko connection checks the host key against that file only"
        )
    port = hostvars.get("ansible_port")
    address = str(hostvars.get("ansible_host", name))
    # Testinfra's user@host[:port] (an IPv6 address in brackets), without the scheme.
    spec = f"{setting('ansible_user')}@" + (f"[{address}]" if ":" in address else address)
    spec += f":{port}" if port else ""
    return testinfra.host.Host(
        KnownHostsParamikoBackend(
            spec, known_hosts=known_hosts, ssh_identity_file=setting("ansible_ssh_private_key_file")
        )
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Without an inventory (e.g. `make suite-ids` collecting the ids) the tests are not parametrized
    # and the inventory_hostname fixture below says how to run them.
    inventory = metafunc.config.option.ansible_inventory
    connection = metafunc.config.option.connection
    if connection not in (None, "paramiko"):
        raise pytest.UsageError(f"--connection={connection}: this scenario's checks connect with paramiko")
    if inventory and "inventory_hostname" in metafunc.fixturenames:
        group = metafunc.config.option.hosts or "all"
        names = AnsibleRunner.get_runner(inventory).get_hosts(group)
        if not names:  # an empty parametrization would skip every check and pass
            raise pytest.UsageError(f"{inventory}: no host in {group}")
        metafunc.parametrize("inventory_hostname", names, scope="module")


@pytest.fixture(scope="module")
def inventory_hostname() -> str:
    pytest.fail("no --ansible-inventory: these checks run through `molecule verify -s default`")


@pytest.fixture(scope="module")
def host(request: pytest.FixtureRequest, inventory_hostname: str):
    lab_host = paramiko_host(request.config.option.ansible_inventory, inventory_hostname)
    yield lab_host
    if "client" in vars(lab_host.backend):
        lab_host.backend.client.close()
