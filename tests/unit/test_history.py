"""sglang_history module (real main()) and the sglang-history CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from conftest import REPO

SENTINEL = 'SENTINEL-SECRET-9f3c'
CLI = REPO / 'roles' / 'sglang' / 'files' / 'sglang-history'
RECORD = {
    'invocation_id': '5f67eaa332b14ce095abdbeeeb5c0407',
    'unit_sha256': 'ab12cd34ef56' * 5,
    'window': 2048,
    'budget': None,
    'topk': 1,
    'result': 'verified',
    'settings': {'api_key': SENTINEL, 'launch': f'--api-key {SENTINEL} --port 30000'},
}


def test_append_writes_one_redacted_line_with_mode_0640(run_module, tmp_path):
    path = tmp_path / 'deploy' / 'history.jsonl'
    result, failed = run_module(
        'sglang_history', {'path': str(path), 'record': RECORD, 'secret_values': [SENTINEL]}
    )
    assert not failed and result['changed'] is True
    assert SENTINEL not in run_module.last_output
    text = path.read_text()
    assert SENTINEL not in text
    assert text.count('\n') == 1
    line = json.loads(text)
    assert line['settings'] == {'api_key': '<redacted>', 'launch': '--api-key <redacted> --port 30000'}
    assert line['window'] == 2048 and line['time'].endswith('Z')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    result2, _ = run_module(
        'sglang_history', {'path': str(path), 'record': dict(RECORD, result='rolled-back')}
    )
    assert result2['changed'] is True
    assert [json.loads(x)['result'] for x in path.read_text().splitlines()] == ['verified', 'rolled-back']


def test_check_mode_reports_changed_and_writes_nothing(run_module, tmp_path):
    path = tmp_path / 'history.jsonl'
    result, failed = run_module(
        'sglang_history', {'path': str(path), 'record': RECORD, '_ansible_check_mode': True}
    )
    assert not failed and result['changed'] is True
    assert not path.exists()


def test_list_returns_last_n_and_counts_bad_lines(run_module, tmp_path):
    path = tmp_path / 'history.jsonl'
    lines = [json.dumps({'time': f't{i}', 'result': 'verified'}) for i in range(5)]
    path.write_text('\n'.join(lines[:3] + ['{not json', '[1, 2]'] + lines[3:]) + '\n')
    result, failed = run_module('sglang_history', {'path': str(path), 'limit': 2})
    assert not failed and result['changed'] is False
    assert [r['time'] for r in result['records']] == ['t3', 't4']
    assert result['skipped_lines'] == 2


def test_list_of_missing_file_is_empty(run_module, tmp_path):
    result, failed = run_module('sglang_history', {'path': str(tmp_path / 'none.jsonl')})
    assert not failed and result['records'] == [] and result['changed'] is False


def test_negative_limit_fails_naming_the_option(run_module, tmp_path):
    result, failed = run_module('sglang_history', {'path': str(tmp_path / 'h.jsonl'), 'limit': -1})
    assert failed and 'limit must be >= 0' in result['msg']


def test_unwritable_path_fails_naming_the_file(run_module, tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    path = blocker / 'history.jsonl'
    result, failed = run_module('sglang_history', {'path': str(path), 'record': RECORD})
    assert failed and str(path) in result['msg']


def test_cli_table_and_json(run_module, tmp_path):
    path = tmp_path / 'history.jsonl'
    run_module('sglang_history', {'path': str(path), 'record': RECORD, 'secret_values': [SENTINEL]})
    out = subprocess.run(
        [sys.executable, str(CLI), '--file', str(path)], capture_output=True, text=True, check=True
    )
    header, row = out.stdout.splitlines()
    assert header.split() == ['TIME', 'INVOCATION', 'UNIT', 'WINDOW/BUDGET/TOPK', 'RESULT']
    assert '5f67eaa332b1' in row and 'ab12cd34ef56' in row and '2048/-/1' in row and row.endswith('verified')
    js = subprocess.run(
        [sys.executable, str(CLI), '--file', str(path), '--json'], capture_output=True, text=True, check=True
    )
    assert json.loads(js.stdout)[0]['invocation_id'] == RECORD['invocation_id']
    missing = subprocess.run(
        [sys.executable, str(CLI), '--file', str(tmp_path / 'x')], capture_output=True, text=True
    )
    assert missing.returncode == 1 and 'no history yet' in missing.stderr
