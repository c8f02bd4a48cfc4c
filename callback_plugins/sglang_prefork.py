# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ready the ansible-playbook process before it forks its workers: the Jinja filters and tests loaded once,
and its objects frozen so the workers' garbage collector never walks them.

ansible-core forks a worker for every task and host, and a worker inherits the parent's whole heap. At the
start of each play this callback:

1. loads the filter and test plugins of the configured and role directories (ansible-core's own ``core``,
   ``mathstuff``, ``urls``..., the role's ``filter_plugins``): the loader builds that table the first time a
   template needs a filter or test, and the parent seldom templates one before it forks, so every worker
   imported and wrapped them again and threw them away on exit - ~10% of a worker's Python calls in a
   no-change pass (169,000 of 1.69 million per host, cProfile of every task of one host). A directory added
   later (a role loaded by include_role) clears the table as it always does, and the workers build it again.
2. collects the parent's garbage and moves everything left into the permanent generation
   (``gc.freeze()``, the standard library's switch for exactly this): a worker's first full collection
   walked every inherited object, touching pages that copy-on-write then copied. Measured on 4 lab hosts, a
   no-change deploy, 4 interleaved pairs: 5.61 -> 5.08 s wall on average, the controller's user CPU
   5.04 -> 4.50 s; on 1 host 3.20 -> 3.09 s.

Nothing a run does or prints changes. The loading uses the loaders' private
``_ensure_non_collection_wrappers`` (ansible-core 2.19, pinned in requirements.txt); with an ansible-core
without it, only step 1 is skipped.
"""

from __future__ import annotations

import gc

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = r"""
name: sglang_prefork
type: aggregate
short_description: Load the Jinja plugins and freeze the parent's objects before the workers fork
description:
  - At each play start, loads the filter and test plugins once in the ansible-playbook process (the workers
    inherit them) and freezes its objects (gc.freeze) so forked workers never walk them; enabled in
    ansible.cfg (callbacks_enabled).
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sglang_prefork"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_play_start(self, play):
        for loader in (filter_loader, test_loader):
            ensure = getattr(loader, "_ensure_non_collection_wrappers", None)
            if ensure is not None:
                ensure()
        gc.collect()
        gc.freeze()
