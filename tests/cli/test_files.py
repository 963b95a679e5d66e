"""The files ``grid-agent`` writes and reads: private when written, regular when read.

``run --transcript`` and ``report --html`` create their file with mode 0600 whatever the
umask, make an existing regular file of that name 0600 before rewriting it, and never write
through a symbolic link planted at the path nor into a FIFO or a device. Every file the
command reads (``--config``, its ``api_key_file``, ``--tools``, ``--image``, ``replay
--config``) must be a regular file (a symbolic link to one is fine): a FIFO is refused at
once, naming the path, instead of blocking the command. A key file other users can read is
used, with a warning on stderr.

A child that blocks fails its test by the short :data:`BLOCKED_S` bound of the ``cli``
fixture instead of hanging the suite.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cli.conftest import CANARY, KEY_ENV, RunCLI, assert_no_key, together

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Bound on a child that must refuse a FIFO at once (a child that blocks fails by it).
BLOCKED_S = 8.0
URL = "https://llm.example.com/v1/chat/completions"
REFUSED_LINK = "it is a symbolic link; refusing to write through it"


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    """The most common umask, set explicitly: the children inherit it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    """The permission bits of ``path`` (not following a link)."""
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
async def transcript(cli: RunCLI, tmp_path: Path) -> Path:
    """A transcript recorded by ``demo``."""
    path = tmp_path / "demo.jsonl"
    recorded = await cli("demo", "--transcript", str(path))
    assert recorded.returncode == 0, recorded.stderr
    return path


# --- files written -----------------------------------------------------------------------------


async def test_transcript_and_html_are_created_private(
    cli: RunCLI, tmp_path: Path, transcript: Path
) -> None:
    """Under umask 022 a new transcript and a new HTML page are still 0600."""
    page = tmp_path / "out.html"
    shown = await cli("report", str(transcript), "--html", str(page))
    assert shown.returncode == 0, shown.stderr
    assert (mode(transcript), mode(page)) == (0o600, 0o600)


async def test_an_existing_file_of_ours_is_rewritten_and_made_private(
    cli: RunCLI, tmp_path: Path, transcript: Path
) -> None:
    """Re-running ``report --html out.html`` (or ``run --transcript t.jsonl``) replaces the
    operator's own regular file, and leaves it 0600 even if it was 0644."""
    page, again = tmp_path / "out.html", tmp_path / "again.jsonl"
    for path in (page, again):
        path.write_text("old content, longer than nothing\n" * 1000, encoding="utf-8")
        path.chmod(0o644)
    shown, recorded = await together(
        cli("report", str(transcript), "--html", str(page)),
        cli("demo", "--transcript", str(again)),
    )
    assert (shown.returncode, recorded.returncode) == (0, 0), shown.stderr + recorded.stderr
    assert (mode(page), mode(again)) == (0o600, 0o600)
    assert "old content" not in page.read_text("utf-8")
    assert "old content" not in again.read_text("utf-8")


async def test_a_symlink_at_the_output_path_is_refused(
    cli: RunCLI, tmp_path: Path, transcript: Path
) -> None:
    """A link planted where the file goes is not written through: exit 2, the reason given,
    the link's target untouched (contents and mode)."""
    target = tmp_path / "victim.txt"
    target.write_text("precious\n", encoding="utf-8")
    target.chmod(0o644)
    page, sink = tmp_path / "out.html", tmp_path / "run.jsonl"
    page.symlink_to(target)
    sink.symlink_to(target)
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "nowhere.html")
    shown, recorded, created = await together(
        cli("report", str(transcript), "--html", str(page)),
        cli("demo", "--transcript", str(sink)),
        cli("report", str(transcript), "--html", str(dangling)),
    )
    assert (shown.returncode, recorded.returncode, created.returncode) == (2, 2, 2)
    assert f"grid-agent report: error: cannot write {str(page)!r}: {REFUSED_LINK}\n" == shown.stderr
    assert f"cannot write transcript {str(sink)!r}: {REFUSED_LINK}" in recorded.stderr
    assert f"cannot write {str(dangling)!r}: {REFUSED_LINK}" in created.stderr
    assert (target.read_text("utf-8"), mode(target)) == ("precious\n", 0o644)
    assert not (tmp_path / "nowhere.html").exists()


async def test_a_fifo_at_the_output_path_is_refused_without_blocking(
    cli: RunCLI, tmp_path: Path, transcript: Path
) -> None:
    """A FIFO where the file goes (nobody reading it) is refused at once, not waited on."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    shown, recorded = await together(
        cli("report", str(transcript), "--html", str(fifo), timeout_s=BLOCKED_S),
        cli("demo", "--transcript", str(fifo), timeout_s=BLOCKED_S),
    )
    assert (shown.returncode, recorded.returncode) == (2, 2)
    said = f"{str(fifo)!r}: it is a FIFO, not a regular file"
    assert f"grid-agent report: error: cannot write {said}\n" == shown.stderr
    assert f"cannot write transcript {said}" in recorded.stderr


# --- files read --------------------------------------------------------------------------------


def config_text(**llm: str) -> str:
    """An [llm] table for a https endpoint with the given keys."""
    lines = ["[llm]", f'endpoint_url = "{URL}"', *(f'{k} = "{v}"' for k, v in llm.items())]
    return "\n".join(lines) + "\n"


async def test_a_fifo_config_file_is_refused_by_every_command(cli: RunCLI, tmp_path: Path) -> None:
    """check-config, probe, run and replay --config name the FIFO and exit 2 at once."""
    fifo = tmp_path / "agent.toml"
    os.mkfifo(fifo)
    checked, probed, ran = await together(
        cli("check-config", str(fifo), timeout_s=BLOCKED_S),
        cli("probe", "--config", str(fifo), "--json", timeout_s=BLOCKED_S),
        cli("run", "--goal", "Go.", "--config", str(fifo), timeout_s=BLOCKED_S),
    )
    assert (checked.returncode, probed.returncode, ran.returncode) == (2, 2, 2)
    said = "it is a FIFO, not a regular file"
    assert f"{fifo}: invalid configuration (1 problem)\n  {fifo}: cannot read: {said}\n" == (
        checked.stderr
    )
    assert f"cannot read: {said}" in probed.json()["message"]
    assert f"cannot read: {said}" in ran.stderr


async def test_replay_config_that_is_a_fifo_is_refused(
    cli: RunCLI, tmp_path: Path, transcript: Path
) -> None:
    """``replay --config FIFO`` names the FIFO and exits 2 at once, in the words ``run``
    uses for its configuration (the file is read by the same rule)."""
    fifo = tmp_path / "loop.toml"
    os.mkfifo(fifo)
    result = await cli("replay", str(transcript), "--config", str(fifo), timeout_s=BLOCKED_S)
    assert result.returncode == 2
    expected = (
        f"grid-agent replay: error: invalid configuration (1 problem): {fifo}: "
        "cannot read: it is a FIFO, not a regular file\n"
    )
    assert expected == result.stderr


@pytest.mark.slow
async def test_a_fifo_or_device_as_key_file_is_refused(cli: RunCLI, tmp_path: Path) -> None:
    """api_key_file naming a FIFO, a link to one, or /dev/zero: exit 2, the path named."""
    fifo, link = tmp_path / "key.fifo", tmp_path / "llm.key"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    configs = {}
    for name, key_file in (("fifo", fifo), ("link", link), ("zero", Path("/dev/zero"))):
        configs[name] = tmp_path / f"{name}.toml"
        configs[name].write_text(config_text(api_key_file=str(key_file)), encoding="utf-8")
    fifo_result, link_result, zero_result, probed = await together(
        cli("check-config", str(configs["fifo"]), timeout_s=BLOCKED_S),
        cli("check-config", str(configs["link"]), timeout_s=BLOCKED_S),
        cli("check-config", str(configs["zero"]), timeout_s=BLOCKED_S),
        cli("probe", "--config", str(configs["link"]), timeout_s=BLOCKED_S),
    )
    assert [r.returncode for r in (fifo_result, link_result, zero_result, probed)] == [2, 2, 2, 2]
    for result, path, kind in (
        (fifo_result, fifo, "a FIFO"),
        (link_result, link, "a FIFO"),
        (zero_result, Path("/dev/zero"), "a character device"),
    ):
        expected = f"cannot read the key file {str(path)!r} (it is {kind}, not a regular file)"
        assert f"  llm.api_key_file: {expected}\n" in result.stderr
    assert f"cannot read the key file {str(link)!r}" in probed.stderr


async def test_a_fifo_as_tools_file_or_image_is_refused(cli: RunCLI, tmp_path: Path) -> None:
    """probe --tools FIFO and --image FIFO: exit 2 at once, the path named, no request."""
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    base = ("probe", "--endpoint", "http://127.0.0.1:9/v1", "--api-key-env", KEY_ENV)
    tools, image = await together(
        cli(*base, "--tools", str(fifo), timeout_s=BLOCKED_S),
        cli(*base, "--image", str(fifo), timeout_s=BLOCKED_S),
    )
    assert (tools.returncode, image.returncode) == (2, 2)
    said = f"{str(fifo)!r}: it is a FIFO, not a regular file"
    assert f"grid-agent probe: error: cannot read tools file {said}\n" == tools.stderr
    assert f"grid-agent probe: error: cannot read image {said}\n" == image.stderr


async def test_a_key_file_readable_by_others_is_warned_about(cli: RunCLI, tmp_path: Path) -> None:
    """Like ssh: a key file with group or other read bits works, with a warning on stderr
    (and in check-config's JSON); a 0600 key file gives none. The key is never shown."""
    shared, private = tmp_path / "shared.key", tmp_path / "private.key"
    for path, bits in ((shared, 0o644), (private, 0o600)):
        path.write_text(CANARY + "\n", encoding="utf-8")
        path.chmod(bits)
    shared_config, private_config = tmp_path / "shared.toml", tmp_path / "private.toml"
    shared_config.write_text(config_text(api_key_file=str(shared)), encoding="utf-8")
    private_config.write_text(config_text(api_key_file=str(private)), encoding="utf-8")
    text, data, quiet = await together(
        cli("check-config", str(shared_config)),
        cli("check-config", str(shared_config), "--json"),
        cli("check-config", str(private_config)),
    )
    assert (text.returncode, data.returncode, quiet.returncode) == (0, 0, 0)
    warning = f"the key file {str(shared)!r} is readable by other users (mode 0644); chmod 600 it"
    assert f"grid-agent check-config: warning: {warning}\n" == text.stderr
    assert [warning] == data.json()["warnings"]
    assert quiet.stderr == ""
    for result in (text, data, quiet):
        assert_no_key(result.stdout, result.stderr)
