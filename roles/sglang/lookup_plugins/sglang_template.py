# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ansible.builtin.template's lookup without its deep copy of every task variable for every template.

ansible-core 2.19's template lookup starts each term with ``deepcopy(variables)`` (its own FIXME asks why it
is not a chain map), only to add the template_* variables and ansible_managed on top. For the role's three
files (tasks/render.yml) that is three copies of every variable of the host - the probe's result, the role's
settings, the inventory's - per host and per run: ~40% of that task's CPU on a lab host (cProfile of one
no-change pass; the task's Python calls 625,000 -> 153,000 per host), paid by every host of a fleet. Here the
variables are chained under one small dict that holds the added ones, so nothing is copied. The task's
variables are still never changed by a template: ``set`` binds names in the template's own scope, and
ansible-core 2.19 hands a template copies of lists and dicts (``{{ argv.append(...) }}`` leaves argv as it
was: tests/unit/test_template_lookup.py).

Everything else is the builtin's: the file found in the role's templates, trusted as a template, the Jinja
search path, the template_* variables and ansible_managed (not clobbered when set), the options.
"""

from __future__ import annotations

import os
from collections import ChainMap

from ansible._internal._templating import _template_vars
from ansible._internal._templating._engine import TemplateOptions, TemplateOverrides
from ansible.errors import AnsibleError
from ansible.plugins.lookup.template import LookupModule as TemplateLookup
from ansible.template import trust_as_template

DOCUMENTATION = r"""
name: sglang_template
author: the sglang-deploy authors
short_description: Render templates as ansible.builtin.template's lookup does, without copying every variable
description:
  - The same terms, options and result as ansible.builtin.template's lookup (ansible-core 2.19), without its
    deprecated options; the task's variables are chained under the added template_* variables instead of
    deep-copied for each term.
options:
  _terms:
    description: The templates, found as the builtin lookup finds them (the role's templates/ first).
  template_vars:
    description: Additional variables, as the builtin lookup's.
    type: dict
    default: {}
  variable_start_string:
    description: As the builtin lookup's.
    default: '{{'
    type: str
  variable_end_string:
    description: As the builtin lookup's.
    default: '}}'
    type: str
  comment_start_string:
    description: As the builtin lookup's.
    default: '{#'
    type: str
  comment_end_string:
    description: As the builtin lookup's.
    default: '#}'
    type: str
  trim_blocks:
    description: As the builtin lookup's.
    type: bool
    default: true
"""

RETURN = r"""
_raw:
  description: The rendered templates, one per term.
  type: list
  elements: raw
"""


class LookupModule(TemplateLookup):
    def run(self, terms, variables=None, **kwargs):
        variables = {} if variables is None else variables
        self.set_options(var_options=variables, direct=kwargs)
        overrides = TemplateOverrides.from_kwargs(
            dict(
                variable_start_string=self.get_option("variable_start_string"),
                variable_end_string=self.get_option("variable_end_string"),
                comment_start_string=self.get_option("comment_start_string"),
                comment_end_string=self.get_option("comment_end_string"),
                trim_blocks=self.get_option("trim_blocks"),
            )
        )
        lookup_template_vars = self.get_option("template_vars")
        ret = []
        for term in terms:
            lookupfile = self.find_file_in_search_path(variables, "templates", term)
            if not lookupfile:
                raise AnsibleError(f"the template file {term} could not be found for the lookup")
            template_data = trust_as_template(self._loader.get_text_file_contents(lookupfile))
            # The Jinja search path for includes: each search path's templates/ subdirectory and itself,
            # after the template's own directory (as the builtin lookup builds it).
            searchpath = [os.path.dirname(lookupfile)]
            for path in variables.get("ansible_search_path", []):
                searchpath += [os.path.join(path, "templates"), path]
            added = dict(
                _template_vars.generate_ansible_template_vars(
                    path=term,
                    fullpath=lookupfile,
                    include_ansible_managed="ansible_managed" not in variables,
                )
            )
            added.update(lookup_template_vars)
            data_templar = self._templar.copy_with_new_env(
                available_variables=ChainMap(added, variables), searchpath=searchpath
            )
            ret.append(
                data_templar._engine.template(
                    template_data, options=TemplateOptions(escape_backslashes=False, overrides=overrides)
                )
            )
        return ret
