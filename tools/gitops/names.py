"""The names a pull request's inventory may give hosts and their connections (issue 37, item 5).

One owner for the rule, standard library only: tools/gitops/datacheck.py applies it to every host and
connection value a pull request's data brings in, and tools/gitops/gitops.py to every host ansible-inventory
lists before a report path is built from its name (a name is a file name of the plan's report directory,
an SSH argument and a --limit pattern).
"""

from __future__ import annotations

import ipaddress
import json
import re

# Letters, digits, '.', '_', '-', starting with a letter or digit, no '..': never a path, an option or a
# pattern (ansible's --limit reads ':', ',', '!', '&', '*', '[' as operators).
HOST_NAME = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
# A DNS name: labels of letters, digits and '-', not starting or ending with '-'.
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")
# A POSIX account name as useradd accepts it (the plan's own --plan-user is checked the same way).
ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def host_name_problem(name) -> str | None:
    """Why `name` cannot be an inventory host name, or None."""
    if isinstance(name, str) and HOST_NAME.match(name):
        return None
    return (
        f"host {quoted(name)} is not a host name (letters, digits, '.', '_' and '-', starting with a letter "
        "or digit, no '..', at most 253 characters): it would become a file name, an SSH argument and a "
        "--limit pattern"
    )


def address_problem(value) -> str | None:
    """Why `value` cannot be an ansible_host, or None."""
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
            return None
        except ValueError:
            if DNS_NAME.match(value):
                return None
    return f"{quoted(value)} is not a host name or IP address"


def port_problem(value) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return None
    if isinstance(value, str) and value.isdigit() and 1 <= int(value) <= 65535:
        return None
    return f"{quoted(value)} is not a port number (1-65535)"


def account_problem(value) -> str | None:
    if isinstance(value, str) and ACCOUNT.match(value):
        return None
    return f"{quoted(value)} is not an account name ([a-z_][a-z0-9_-]*, at most 32 characters)"


def bool_problem(value) -> str | None:
    return None if isinstance(value, bool) else f"{quoted(value)} is not true or false"


def quoted(value) -> str:
    """A name as JSON text: control characters and quotes escaped, so a message cannot be forged by it."""
    text = json.dumps(value if isinstance(value, (str, int, float, bool)) or value is None else str(value))
    return text if len(text) <= 80 else text[:77] + '..."'


# The connection variables a pull request's data may set, each with its check. In a plan they are overridden
# by tools/gitops/plan's extra variables (ansible_user, ansible_become) or only name where to connect.
CONNECTION = {
    "ansible_host": address_problem,
    "ansible_port": port_problem,
    "ansible_user": account_problem,
    "ansible_become": bool_problem,
}
