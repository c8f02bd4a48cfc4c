#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_history
short_description: Append to or read the SGLang deploy history (JSON lines)
description:
  - With O(record), appends one JSON line (the record plus C(time), UTC ISO 8601) to O(path),
    redacted first (secret keys and O(secret_values) never reach the file). The write uses
    C(O_APPEND) and C(fsync), so concurrent appends never interleave inside a line and a
    record survives a crash once the module returned. The file is created C(0640) root.
  - Without O(record), returns the last O(limit) records (read-only).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  path:
    description: History file.
    type: path
    default: /var/lib/sglang-deploy/history.jsonl
  record:
    description: Record to append (e.g. invocation, unit hash, window/budget/topk, result).
    type: dict
  limit:
    description: Number of most recent records returned when O(record) is not given.
    type: int
    default: 20
  secret_values:
    description: Literal secret values to scrub from the record before writing.
    type: list
    elements: str
    default: []
  known_good:
    description:
      - With O(record), first keep the files just verified as the known-good ones (what a rollback
        restores); each of O(known_good.files) is copied to O(known_good.dir) (C(0600) root), its sha256
        is added to the record and to the metadata file as C(<name>_sha256), and O(known_good.meta) (plus
        O(known_good.api_key)) is written to O(known_good.dir)/O(known_good.meta_name).
      - The SET is switched atomically - all files are written into a new directory
        C(<known_good.dir>.<ns>/) (0700), then O(known_good.dir) becomes a symlink to it by one C(rename(2))
        and the previous generation is removed; a reader sees the old set or the new one, never a mix. A real
        directory there (kept by an older version of the role) is renamed aside first, the one step that is
        not atomic.
      - All of it in the same call as the record, so a verified deploy costs one round trip.
      - With O(known_good.sha256), the files on disk must be exactly the ones the verified restart started;
        any file whose sha256 differs (written by hand or by another run during the readiness and stability
        window) fails the module naming it, and NOTHING is kept or recorded.
    type: dict
    suboptions:
      dir:
        description: Known-good directory (created C(0700) root).
        type: path
        required: true
      files:
        description: "Name -> path of each verified file, e.g. C({unit: /etc/systemd/system/sglang.service})."
        type: dict
        required: true
      meta_name:
        description: File name of the metadata (JSON) in O(known_good.dir).
        type: str
        required: true
      meta:
        description: What a rollback needs besides the files (listener, expected arguments, invocation).
        type: dict
        default: {}
      api_key:
        description: API key the known-good server answers to, kept in the metadata (never returned).
        type: str
        default: ''
      sha256:
        description:
          - "Name -> sha256 (hex) of each file as the verified restart started it, taken before the
            restart (e.g. C({unit: ..., env: ...}); the names of O(known_good.files)). A name missing here
            is not checked."
        type: dict
        default: {}
      keep_replaced:
        description:
          - A path beside O(known_good.dir). The set this one replaces is kept, and the path becomes a
            symlink to it (no set replaced, as on a fresh host, and the path goes). What the rolling play
            reverts to after a Failed canary, an abort or a later batch's failure.
          - A kept set stays until the next switch with O(known_good.keep_replaced) or until the path goes.
        type: path
  clear_pending:
    description:
      - With O(record), the pending marker C(sglang_unit) wrote before it replaced the files. Once the
        record is on disk the marker is removed (the run is finished, verified, or rolled back, verified
        or not; the record says which) and its content is added to the record as C(pending).
      - A marker that is not there changes nothing.
    type: path
  textfile:
    description:
      - With O(record), once it is written - rewrite this node_exporter textfile from it (what runs now) -
        C(sglang_deploy_info{service, config_hash, invocation, window, budget, topk, algorithm,
        sglang_version, result} 1) and C(sglang_deploy_timestamp_seconds) with the same labels (the record's
        C(time)), the labels from the record's fields of those names (C(invocation) from C(invocation_id)),
        escaped as Prometheus' text format wants. Written atomically (a file beside it, then a rename),
        C(0644) root, its directory made C(0755) when missing.
      - A textfile that cannot be written is a warning (RV(textfile.error)), not a failure - the record
        stands.
    type: dict
    suboptions:
      path:
        description: The textfile (node_exporter's textfile collector reads C(*.prom) files of its directory).
        type: path
        required: true
      service:
        description: The service the record is of (the C(service) label).
        type: str
        required: true
attributes:
  check_mode:
    support: full
    details: With O(record), reports changed and writes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Record the verified deploy
  sglang_history:
    record:
      invocation_id: "{{ __sglang_restart.invocation_id }}"
      unit_sha256: "{{ __sglang_unit.checksum }}"
      window: "{{ sglang_speculative_draft_window_size }}"
      result: verified

- name: Read the last five deploys
  sglang_history:
    limit: 5
  register: __sglang_history
"""

RETURN = r"""
records:
  description: Last O(limit) records, oldest first (only without O(record)).
  returned: when record is not given
  type: list
  elements: dict
  sample:
    - {"time": "2026-12-02T16:40:00Z", "invocation_id": "5f67eaa3...", "window": 2048, "result": "verified"}
record:
  description: The record as written (redacted, with C(time)).
  returned: when record is given
  type: dict
skipped_lines:
  description: Lines of the file that were not valid JSON objects (reported, not fatal).
  returned: when record is not given
  type: int
pending_cleared:
  description: O(clear_pending) was there and is removed now (in check mode, would be).
  returned: when record is given
  type: bool
textfile:
  description: With O(textfile), its C(path) and C(written) (false in check mode), or C(error).
  returned: when record and textfile are given
  type: dict
  sample: {"path": "/var/lib/node_exporter/textfile_collector/sglang_deploy.prom", "written": true}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_history import (  # noqa: E402
    KNOWN_GOOD_OPTIONS,
    TEXTFILE_OPTIONS,
    NotRecorded,
    read_records,
    write,
)
from ansible.module_utils.sglang_redact import redact  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/var/lib/sglang-deploy/history.jsonl"),
            record=dict(type="dict"),
            limit=dict(type="int", default=20),
            secret_values=dict(type="list", elements="str", default=[], no_log=True),
            known_good=dict(type="dict", options=KNOWN_GOOD_OPTIONS),
            clear_pending=dict(type="path"),
            textfile=dict(type="dict", options=TEXTFILE_OPTIONS),
        ),
        supports_check_mode=True,
    )
    path, record = module.params["path"], module.params["record"]
    secrets = module.params["secret_values"]
    if record is None:
        if module.params["limit"] < 0:
            module.fail_json(msg=f"limit must be >= 0, got {module.params['limit']}")
        try:
            records, skipped = read_records(path, module.params["limit"])
        except OSError as exc:
            module.fail_json(msg=f"cannot read history file {path}: {exc.strerror}")
        module.exit_json(changed=False, records=redact(records, secrets), skipped_lines=skipped, path=path)

    try:
        entry, cleared, textfile = write(
            path,
            record,
            known_good=module.params["known_good"],
            clear_pending=module.params["clear_pending"],
            secrets=secrets,
            check_mode=module.check_mode,
            textfile=module.params["textfile"],
        )
    except NotRecorded as exc:
        module.fail_json(msg=str(exc), recorded=False)
    result = dict(changed=True, record=entry, path=path, pending_cleared=cleared)
    if textfile is not None:
        result["textfile"] = textfile
        if "error" in textfile:
            module.warn(f"recorded, but the node_exporter textfile is not: {textfile['error']}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
