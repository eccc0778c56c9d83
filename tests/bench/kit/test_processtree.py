"""A server's cost is its whole process tree's: every process under the one started, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from batchd.bench.kit import processtree


def test_the_parent_is_read_past_a_command_name_with_spaces_and_parens() -> None:
    assert processtree.parent_of("42 (ray::Serve (x) 1) S 7 42 42 0 -1") == 7


def test_descendants_are_every_process_below_the_root_and_no_other() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert sorted(processtree.descendants(10, parents)) == [10, 11, 12, 13]


def test_a_child_process_counts_in_the_tree_and_new_processes_count_whole() -> None:
    # A child that waits on its stdin: alive until the test closes it, no sleep involved.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        tree = processtree.sample(os.getpid())
        assert child.pid in tree.cpu_s and os.getpid() in tree.cpu_s
        assert tree.rss_bytes > 0 and tree.pss_bytes > 0
        before = processtree.TreeSample({os.getpid(): 0.0}, 0, 0)
        assert processtree.cpu_between(before, tree) == sum(tree.cpu_s.values())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
