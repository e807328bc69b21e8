"""Where the package finds its data: the checkout, or the copy setup.cfg's data_files install."""

from __future__ import annotations

import configparser
import glob
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from gpusim import data_paths
from gpusim.config.loader import hwconfig_dirs, list_presets, load_system_config
from gpusim.data_paths import INSTALLED_DATA, data_root
from gpusim.studies.concurrency_workloads import WORKLOADS
from gpusim.trace.models import list_models, model_dirs
from gpusim.validation import MEASURED_DIR

REPO = Path(__file__).resolve().parents[1]


def data_files() -> dict[str, list[str]]:
    """setup.cfg's ``[options.data_files]``: destination -> its glob patterns, as setuptools reads them."""
    parser = configparser.ConfigParser()
    parser.optionxform = str  # setuptools keeps the destinations' case
    parser.read(REPO / "setup.cfg")
    section = parser["options.data_files"]
    return {dest: [p.strip() for line in value.splitlines() for p in line.split(",") if p.strip()]
            for dest, value in section.items()}


def read_folders() -> list[Path]:
    """The data folders the package reads, relative to :func:`data_root` (from the code itself)."""
    root = data_root()
    return [folder.relative_to(root) for folder in (hwconfig_dirs()[-1], model_dirs()[-1], WORKLOADS, MEASURED_DIR)]


def git_files(*args: str) -> list[Path]:
    """Files of the data folders that ``git ls-files ARGS`` lists (skips outside a git checkout)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    folders = [folder.as_posix() for folder in read_folders()]
    out = subprocess.run(["git", "ls-files", "-z", *args, "--", *folders], cwd=REPO, capture_output=True, check=True)
    return [Path(name) for name in out.stdout.decode().split("\0") if name]


def test_the_package_reads_the_checkout_when_it_runs_from_one():
    assert data_root() == REPO
    assert [folder.as_posix() for folder in read_folders()] == [
        "hwconfigs", "workloads/models", "workloads/concurrency", "validation/measured"]


def test_data_files_install_every_tracked_data_file_once_in_its_place():
    covered: dict[Path, list[str]] = {}
    for dest, patterns in data_files().items():
        assert Path(dest).parts[:2] == INSTALLED_DATA.parts, f"{dest}: not under {INSTALLED_DATA}"
        for pattern in patterns:
            matches = glob.glob(pattern, root_dir=REPO, recursive=True)
            assert matches, f"setup.cfg data_files: {pattern} matches nothing"
            for match in matches:
                assert (REPO / match).is_file(), f"setup.cfg data_files: {pattern} matches a folder, {match}"
                covered.setdefault(Path(match), []).append(dest)

    tracked = [path for path in git_files() if (REPO / path).is_file()]
    assert tracked
    problems = []
    for path in tracked:
        dests = covered.get(path, [])
        want = (INSTALLED_DATA / path.parent).as_posix()
        if dests != [want]:
            problems.append(f"{path}: installed to {dests or 'nowhere'}, expected exactly [{want!r}]")
    assert not problems, "setup.cfg [options.data_files] does not match the data:\n" + "\n".join(problems)

    # Nothing outside the data folders, and no generated outputs or caches (git-ignored files).
    folders = read_folders()
    stray = [path for path in covered if not any(path.is_relative_to(folder) for folder in folders)]
    assert not stray, f"data_files ship files the package does not read: {stray}"
    ignored = set(git_files("--others", "--ignored", "--exclude-standard"))
    assert not ignored & set(covered), f"data_files ship git-ignored files: {sorted(ignored & set(covered))}"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package without a checkout beside it (site-packages) and the prefix it was installed to.

    ``sys.base_prefix`` differs from ``sys.prefix``, as in a virtual environment, so a root taken
    from the wrong one fails.
    """
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    site_packages.mkdir(parents=True)
    monkeypatch.setattr(data_paths, "CHECKOUT_ROOT", site_packages)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "base"))
    monkeypatch.delenv("GPUSIM_HWCONFIGS", raising=False)
    monkeypatch.delenv("GPUSIM_MODELS", raising=False)
    return tmp_path / "venv"


def test_data_root_falls_back_to_the_installed_copy(installed):
    assert data_root() == installed / "share" / "gpusim"
    assert hwconfig_dirs() == [installed / "share" / "gpusim" / "hwconfigs"]
    assert model_dirs() == [installed / "share" / "gpusim" / "workloads" / "models"]
    assert list_presets() == {"gpus": [], "nodes": []}  # nothing installed there yet


def test_a_user_install_is_found_where_the_prefix_has_none(installed, tmp_path, monkeypatch):
    monkeypatch.setattr(site, "getuserbase", lambda: str(tmp_path / "user"))
    assert data_root() == installed / "share" / "gpusim"  # neither exists: the prefix's
    (tmp_path / "user" / "share" / "gpusim").mkdir(parents=True)
    assert data_root() == tmp_path / "user" / "share" / "gpusim"
    (installed / "share" / "gpusim").mkdir(parents=True)
    assert data_root() == installed / "share" / "gpusim"  # the environment's own copy first


def test_the_installed_copy_serves_presets_and_models(installed):
    """Lay the data out as an install of setup.cfg's data_files would, then load from it."""
    in_checkout = ({kind: sorted(path.stem for path in (REPO / "hwconfigs" / kind).glob("*.yaml"))
                    for kind in ("gpus", "nodes")},
                   sorted(path.stem for path in (REPO / "workloads" / "models").glob("*.yaml")))
    for dest, patterns in data_files().items():
        for pattern in patterns:
            for match in glob.glob(pattern, root_dir=REPO):
                (installed / dest).mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / match, installed / dest)
    assert (list_presets(), list_models()) == in_checkout
    assert load_system_config("t3-ring8").num_gpus == 8


def test_the_checkout_wins_when_its_marker_is_there(installed, tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (checkout / "hwconfigs").mkdir(parents=True)
    monkeypatch.setattr(data_paths, "CHECKOUT_ROOT", checkout)
    assert data_root() == checkout
