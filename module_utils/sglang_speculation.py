# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does speculative decoding take effect (issue 38 item 3)? One deterministic request through the server's
own API and SGLang's per-request figures in its answer.

SGLang 0.5.23 puts them into ``meta_info`` of a ``/generate`` answer (srt/managers/tokenizer_manager.py,
``_calculate_spec_decoding_metrics``: ``spec_verify_ct``, the verify forwards of the request, next to
``completion_tokens``); its ``sglang/test/send_one.py`` reads the acceptance length as
``completion_tokens / spec_verify_ct``, and 1.0 without ``spec_verify_ct`` (nothing was verified: no
speculation). The request: temperature 0, a prompt longer than the draft window, a fixed number of new
tokens (``ignore_eos``, so the count does not depend on the text). Standard library only.
"""

from __future__ import annotations

import json
import os

from ansible.module_utils.sglang_http import HttpError, base_url, post_json

# Words of the probe's prompt, repeated: what the prompt says does not matter, its length does.
PROMPT_WORDS = ("the", "server", "proves", "that", "speculative", "decoding", "takes", "effect", "here")
NEW_TOKENS = 64


def probe_request(window, new_tokens=NEW_TOKENS):
    """The /generate body: a prompt of more words than the draft window (at least 64), temperature 0,
    ``new_tokens`` new tokens whatever the text."""
    words = max(int(window or 0) + 16, 64)
    prompt = " ".join(PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(words))
    return {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": int(new_tokens), "ignore_eos": True},
    }


class ProbeError(Exception):
    """The probe got no usable answer; the message names the request."""


def acceptance(meta_info):
    """The acceptance length of one answer, as send_one.py computes it: ``completion_tokens /
    spec_verify_ct``, 1.0 when the server verified nothing (``spec_verify_ct`` absent or 0). Returns a dict
    with ``accept_length`` (rounded to 3 places), ``completion_tokens``, ``spec_verify_ct`` and ``stand_in``
    (true when the lab's stand-in server made the figures: its ``meta_info`` says ``lab_server``)."""
    if not isinstance(meta_info, dict) or not isinstance(meta_info.get("completion_tokens"), int):
        raise ProbeError(f"the answer's meta_info has no completion_tokens: {json.dumps(meta_info)[:300]}")
    done, verify = meta_info["completion_tokens"], meta_info.get("spec_verify_ct")
    length = done / verify if isinstance(verify, int) and verify > 0 else 1.0
    return {
        "accept_length": round(length, 3),
        "completion_tokens": done,
        "spec_verify_ct": verify if isinstance(verify, int) else None,
        "stand_in": bool(meta_info.get("lab_server")),
    }


def measure(host, port, api_key, window, new_tokens=NEW_TOKENS, timeout=120.0):
    """POST the probe to ``/generate`` and read its acceptance; raises ProbeError."""
    url = base_url(host, port) + "/generate"
    try:
        code, body = post_json(url, probe_request(window, new_tokens), api_key=api_key, timeout=timeout)
    except HttpError as exc:
        raise ProbeError(str(exc)) from None
    if code != 200 or not isinstance(body, dict):
        raise ProbeError(f"POST {url} answered {code}: {str(body)[:300]}")
    return dict(acceptance(body.get("meta_info")), new_tokens=int(new_tokens))


def below_minimum(result, minimum):
    """The sentence that fails a deploy whose acceptance length is under ``minimum`` (0/None: record only)."""
    if not minimum or result["accept_length"] >= float(minimum):
        return None
    return (
        f"speculative decoding acceptance length {result['accept_length']} (completion_tokens "
        f"{result['completion_tokens']} / spec_verify_ct {result['spec_verify_ct']}) is under "
        f"sglang_min_accept_length {minimum}"
    )


def drafter_window(draft_path):
    """``(path of the drafter's config.json, the field, its sliding window)`` as SGLang's DFLASH reads it
    (srt/speculative/dflash_utils.py get_dflash_attention_sliding_window_size: ``text_config.sliding_window``,
    else ``sliding_window``); ``(path, None, None)`` when it names none or cannot be read."""
    path = os.path.join(str(draft_path), "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return path, None, None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for field, where in (("text_config.sliding_window", text), ("sliding_window", config)):
        if isinstance(where.get("sliding_window"), int):
            return path, field, where["sliding_window"]
    return path, None, None


def window_warning(draft_path, window):
    """The warning when the draft window exceeds the sliding window the drafter was trained with, or None."""
    path, field, trained = drafter_window(draft_path)
    if trained is None or not window or int(window) <= trained:
        return None
    return (
        f"the draft window {window} exceeds the sliding window the drafter was trained with: {path} "
        f"{field} = {trained}"
    )
