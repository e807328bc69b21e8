"""A command's outputs replace their namesakes whole, and files an earlier command left are named."""

import pytest

from gpusim.output_files import WRITTEN_LIST, staged_outputs


def test_files_an_earlier_command_wrote_and_this_one_did_not_are_named_not_removed(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("the user's")
    with staged_outputs(tmp_path) as stage:
        (stage / "ops.csv").write_text("first")
        (stage / "memory.csv").write_text("first")
    assert capsys.readouterr().err == ""  # nothing was written here before
    with staged_outputs(tmp_path) as stage:
        (stage / "ops.csv").write_text("second")
    assert capsys.readouterr().err == (f"note: {tmp_path} also holds memory.csv from an earlier command, which this "
                                       f"one did not write\n")
    assert (tmp_path / "ops.csv").read_text() == "second" and (tmp_path / "memory.csv").read_text() == "first"
    assert (tmp_path / "mine.txt").read_text() == "the user's"  # never a gpusim output: never named
    assert (tmp_path / WRITTEN_LIST).read_text() == "ops.csv\n"
    (tmp_path / "memory.csv").unlink()
    with staged_outputs(tmp_path) as stage:
        (stage / "ops.csv").write_text("third")
    assert capsys.readouterr().err == ""


def test_a_failed_command_leaves_the_folder_and_its_list_as_they_were(tmp_path, capsys):
    with staged_outputs(tmp_path) as stage:
        (stage / "ops.csv").write_text("first")
    try:
        with staged_outputs(tmp_path) as stage:
            (stage / "summary.csv").write_text("half")
            raise RuntimeError("the simulation failed")
    except RuntimeError:
        pass
    assert sorted(path.name for path in tmp_path.iterdir()) == [WRITTEN_LIST, "ops.csv"]
    assert (tmp_path / WRITTEN_LIST).read_text() == "ops.csv\n" and capsys.readouterr().err == ""


def test_a_whole_write_spares_the_users_files_and_removes_the_folders_of_a_failed_one(tmp_path):
    from gpusim.errors import GpusimError
    from gpusim.output_files import write_whole

    (tmp_path / "keep.json.tmp").write_text("mine")
    write_whole(tmp_path / "keep.json", lambda tmp: tmp.write_text("{}"), "a file")
    assert (tmp_path / "keep.json.tmp").read_text() == "mine" and (tmp_path / "keep.json").read_text() == "{}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["keep.json", "keep.json.tmp"]

    def fail(tmp):
        raise OSError(28, "No space left on device")

    with pytest.raises(GpusimError, match=r"new/deeper/x.json: cannot write a file: No space left on device"):
        write_whole(tmp_path / "new" / "deeper" / "x.json", fail, "a file")
    assert not (tmp_path / "new").exists()
