"""The README's quick start, run the way a newcomer runs it: every shell block of its "Quick
start" section, in a copy of this checkout with a fresh virtual environment, against the
`leash dev` its first block starts (on a free port, its state in a temporary directory). The
test command (the second block) runs verbatim too, with PYTEST_ADDOPTS narrowing it to one
test so that it does not run this whole suite again inside itself. Then the guide's blocks
run in the same shell (all but those that start a server of their own): every command in the
README is copy-pastable after the quick start's install.

Marked ``readme`` (and ``slow``): it is part of every full run, CI's included, and takes a
few minutes, most of them pip's; each step has its own deadline.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, wait_for

README = ROOT / "README.md"
RUN_COMMAND = "python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/leash dev"
TEST_COMMAND = ("python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' "
                "&& .venv/bin/pytest -n 4 --dist loadgroup")


def sh_blocks(heading: str) -> list[str]:
    """The ```sh blocks of one ``## `` section of the README."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def quick_start_blocks() -> list[str]:
    return sh_blocks("Quick start")


def guide_blocks(port: int) -> list[str]:
    """The guide's blocks that run and end (not those that start a server of their own), with
    its addresses on the port of the test's `leash dev`."""
    return [block.replace("localhost:5000", f"localhost:{port}") for block in sh_blocks("Guide")
            if "leash dev" not in block and "export " not in block]


def test_the_quick_start_begins_with_the_two_commands_and_ci_runs_the_same_test_command():
    blocks = quick_start_blocks()
    assert blocks[:2] == [RUN_COMMAND, TEST_COMMAND]
    assert len(README.read_text().splitlines()) <= 300
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.replace('"$PYTHON"', "python3.11").replace(" -q ", " ") == TEST_COMMAND


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _get(url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.read().decode()


def _answers(url: str) -> bool:
    try:
        return _get(url)[0] == 200
    except OSError:
        return False


@pytest.mark.readme
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_shell_block_of_the_quick_start_works_in_a_fresh_checkout(tmp_path):
    from cli.devserver import free_port

    run, tests, *usage = quick_start_blocks()
    checkout = tmp_path / "leash"
    _copy_checkout(checkout)
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS_URL", "LEASH_", "SECRET_KEY", "PYTEST_", "VIRTUAL_ENV", "PORT"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), PORT=str(port), PIP_DISABLE_PIP_VERSION_CHECK="1")
    log = (tmp_path / "dev.log").open("w")
    # Its own session, like a terminal's foreground job: Ctrl-C reaches the whole group.
    dev = subprocess.Popen(["bash", "-c", run], cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    seen: set[int] = set()

    def note_children() -> None:
        try:
            seen.update(p.pid for p in psutil.Process(dev.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def dev_is_up() -> bool:
        note_children()
        assert dev.poll() is None, (tmp_path / "dev.log").read_text()[-3000:]
        return _answers(f"http://127.0.0.1:{port}/healthz")

    try:
        wait_for(dev_is_up, 600, interval=1, message="block 1 to install and start leash dev")

        nested = subprocess.run(["bash", "-c", tests], cwd=checkout, capture_output=True, text=True, timeout=600,
                                env=dict(env, PYTEST_ADDOPTS="-q -p no:cacheprovider tests/test_codebase.py -k settings"))
        assert nested.returncode == 0 and "1 passed" in nested.stdout, nested.stdout[-3000:] + nested.stderr[-3000:]

        script = "set -euo pipefail\n" + "\n".join(usage)
        used = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=180)
        assert used.returncode == 0, used.stdout[-3000:] + used.stderr[-3000:]
        assert re.search(r"^state\s+succeeded$", used.stdout, re.M), used.stdout
        with (checkout / "results.csv").open(encoding="utf-8") as rows:
            table = list(csv.reader(rows))
        assert [row[1] for row in table[1:]] == ["I love it", "it is broken", "how do I reset it?"]
        assert all(row[2] in ("positive", "negative", "question") for row in table[1:]), table

        # Step 5, the pages the README names.
        for path in ("/", "/jobs", "/overview"):
            status, html = _get(f"http://127.0.0.1:{port}{path}")
            assert status == 200, path
        assert "first try" in _get(f"http://127.0.0.1:{port}/jobs")[1]

        guide = "set -euo pipefail\n" + "\n".join(usage[:1] + guide_blocks(port))
        followed = subprocess.run(["bash", "-c", guide], cwd=checkout, env=env, capture_output=True, text=True,
                                  timeout=180)
        assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
        assert '"state":"queued"' in followed.stdout and '"url":"/jobs/' in followed.stdout  # the API's 202
        assert "of owner shared" in followed.stderr and "skipped" in followed.stdout  # jobs, replay
    finally:
        note_children()
        os.killpg(dev.pid, signal.SIGINT)  # Ctrl-C
        try:
            dev.wait(timeout=60)
        finally:
            for pid in seen | {dev.pid}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            dev.wait(timeout=10)
            log.close()


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")  # a "# comment" inside a code block is not a heading
        if line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_link_between_the_readme_and_docs_leads_somewhere():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            found = (page.parent / file).resolve() if file else page
            if not found.exists() or (anchor and found.suffix == ".md" and anchor not in _anchors(found)):
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
